"""Backpressure on the real llama.cpp engines (issue #12, item 5), across the Ray hop: a stream
whose reader stops holds the decode back, and closing it aborts the request.

The test opens the replica's stream the way the router does (Ray's streaming generator with its
backpressure), reads the first batch and then nothing. Through the gateway the same happens once
the socket buffers on the way are full (a few MB; tests/test_redteam_stream.py shows it end to
end with the synthetic engine, which fills them in a second: SmolLM2 on this CPU needs a minute).

One-sequence engine: its decode thread waits in `feed.put`. Batched engine: the scheduler leaves
the stalled sequence out of its decodes and keeps serving the others.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray

from backends.cluster.router import UNREAD_BATCHES
from protocol.generation import GenerateRequest, SamplingParams
from tests.conftest import CHAT_MODEL, replica_actors
from tests.support.admin import chat_spec, deployed
from tests.support.gateway import GatewayProcess
from tests.support.ops import wait_for

MAX_TOKENS = 1500
# SmolLM2's end-of-text / chat markers, banned so the answer runs to max_tokens.
NO_END = {0: -100.0, 1: -100.0, 2: -100.0}
BATCHED = "lc-bp-batched"


def _request(tag: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"{tag}/{uuid.uuid4().hex[:8]}",
        sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logit_bias=NO_END),
        prompt="Count from one to one thousand: one, two, three,",
    )


def _stats(actor: Any) -> Any:
    return ray.get(actor.stats.remote(), timeout=60)


def _stall_and_close(actor: Any, tag: str) -> tuple[int, Any]:
    """Open a stream on `actor`, read its first batch, then nothing: returns the tokens made by
    the time they stop, and the stream (still open)."""
    before = _stats(actor)
    stream = actor.generate.options(
        num_returns="streaming", _generator_backpressure_num_objects=UNREAD_BATCHES
    ).remote(_request(tag))
    first = ray.get(next(stream), timeout=120)
    assert first and first[0].completion_tokens >= 1
    counts = [_stats(actor).tokens_generated_total]
    while len(counts) < 4 or counts[-1] != counts[-3]:  # unchanged for a second
        time.sleep(0.5)
        counts.append(_stats(actor).tokens_generated_total)
        assert len(counts) < 120, f"the engine never stopped: {counts}"
    made = counts[-1] - before.tokens_generated_total
    assert any(i.startswith(f"{tag}/") for i in _stats(actor).running_ids)  # waiting, not ended
    return made, stream


def _closed_and_aborted(actor: Any, stream: Any, tag: str, aborted_before: int) -> None:
    ray.cancel(stream)
    wait_for(
        lambda: (
            _stats(actor).aborted_total == aborted_before + 1
            and not any(i.startswith(f"{tag}/") for i in _stats(actor).running_ids)
        ),
        30,
        0.1,
        "the stalled request to be aborted",
    )


def test_the_decode_thread_waits_for_its_reader_and_closing_aborts(gateway: GatewayProcess) -> None:
    actor = replica_actors(CHAT_MODEL)[0]
    aborted = _stats(actor).aborted_total
    made, stream = _stall_and_close(actor, "bp-one")
    # Bounded by what may wait unread: Ray's window, the replica's pump, the engine's feed.
    assert made < UNREAD_BATCHES * 64 + 64 + 64 + 8 < MAX_TOKENS, made
    _closed_and_aborted(actor, stream, "bp-one", aborted)
    # The thread was released: the replica serves the next request.
    r = httpx.post(
        f"{gateway.url}/v1/completions",
        json={"model": CHAT_MODEL, "prompt": "Hi", "max_tokens": 3},
        timeout=120,
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def batched(gateway: GatewayProcess) -> Iterator[str]:
    spec = chat_spec(BATCHED, engine={"n_ctx": 2048, "n_threads": 1, "n_seq_max": 2})
    with deployed(gateway.url, spec) as name:
        yield name


def test_the_batched_scheduler_pauses_a_stalled_sequence_and_serves_the_others(
    gateway: GatewayProcess, batched: str
) -> None:
    (actor,) = replica_actors(batched)
    aborted = _stats(actor).aborted_total
    made, stream = _stall_and_close(actor, "bp-batched")
    assert made < UNREAD_BATCHES * 64 + 64 + 64 + 8 < MAX_TOKENS, made
    # The other slot still decodes while the stalled sequence is paused.
    r = httpx.post(
        f"{gateway.url}/v1/completions", json={"model": batched, "prompt": "Hi", "max_tokens": 8}, timeout=120
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    _closed_and_aborted(actor, stream, "bp-batched", aborted)
