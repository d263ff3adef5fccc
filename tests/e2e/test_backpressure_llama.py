"""Backpressure on the real llama.cpp engines (issue #12, item 5), across the Ray hop: a stream
whose reader stops holds the decode back, and closing it aborts the request.

The test opens the replica's stream the way the router does (Ray's streaming generator with its
backpressure), reads the first batch and then nothing. Through the gateway the same happens once
the socket buffers on the way are full (a few MB; tests/e2e/test_redteam_stream.py shows it end to
end with the synthetic engine, which fills them in a second: SmolLM2 on this CPU needs a minute).

One-sequence engine: its decode thread waits in `feed.put`. Batched engine: the scheduler leaves
the stalled sequence out of its decodes and keeps serving the others.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray

from raygate.backends.cluster.routing.router import UNREAD_BATCHES
from raygate.protocol.generation import GenerateRequest, SamplingParams
from tests.support.admin import chat_spec, deployed
from tests.support.gateway import GatewayProcess
from tests.support.ops import wait_for
from tests.support.replicas import replica_actors

MAX_TOKENS = 1500
# SmolLM2's end-of-text / chat markers, banned so the answer runs to max_tokens.
NO_END = {0: -100.0, 1: -100.0, 2: -100.0}
BATCHED = "lc-bp-batched"
ONE_SEQUENCE = "lc-bp-one"


def _request(tag: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"{tag}/{uuid.uuid4().hex[:8]}",
        sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logit_bias=NO_END),
        prompt="Count from one to one thousand: one, two, three,",
    )


def _stats(actor: Any) -> Any:
    return ray.get(actor.stats.remote(), timeout=60)


# Two cores busy with other work decode SmolLM2 at a few tokens a second: the engine may need a
# minute or two to fill what may wait unread. Generous, and only a bound on a hang.
STALL_DEADLINE_S = 600
# The engine counts as stopped once its token count is unchanged for this long.
STILL_S = 2.0


@contextlib.contextmanager
def stalled(actor: Any, tag: str) -> Iterator[tuple[int, Any]]:
    """Open a stream on `actor`, read its first batch, then nothing: yields the tokens made by the
    time they stop, and the stream (still open). The stream is cancelled on the way out whatever
    happened, so a failed check never leaves the replica's decode waiting for a reader that the
    next tests would queue behind."""
    before = _stats(actor)
    stream = actor.generate.options(
        num_returns="streaming", _generator_backpressure_num_objects=UNREAD_BATCHES
    ).remote(_request(tag))
    try:
        first = ray.get(next(stream), timeout=120)
        assert first and first[0].completion_tokens >= 1
        deadline = time.monotonic() + STALL_DEADLINE_S
        count, since = _stats(actor).tokens_generated_total, time.monotonic()
        while time.monotonic() - since < STILL_S:
            assert time.monotonic() < deadline, f"the engine never stopped: {count} tokens"
            time.sleep(0.25)
            now = _stats(actor).tokens_generated_total
            if now != count:
                count, since = now, time.monotonic()
        made = count - before.tokens_generated_total
        assert any(i.startswith(f"{tag}/") for i in _stats(actor).running_ids)  # waiting, not ended
        yield made, stream
    finally:
        ray.cancel(stream)


def _aborted(actor: Any, tag: str, aborted_before: int) -> None:
    """After the stream is cancelled: the request leaves the engine, counted as aborted."""
    wait_for(
        lambda: (
            _stats(actor).aborted_total == aborted_before + 1
            and not any(i.startswith(f"{tag}/") for i in _stats(actor).running_ids)
        ),
        120,
        0.1,
        "the stalled request to be aborted",
    )


@pytest.fixture(scope="module")
def one_sequence(gateway: GatewayProcess) -> Iterator[str]:
    """The one-sequence engine (the default chat model decodes several sequences per step)."""
    spec = chat_spec(ONE_SEQUENCE, engine={"n_ctx": 2048, "n_threads": 1})
    with deployed(gateway.url, spec) as name:
        yield name


@pytest.mark.timeout(900)  # STALL_DEADLINE_S on two busy cores
def test_the_decode_thread_waits_for_its_reader_and_closing_aborts(
    gateway: GatewayProcess, one_sequence: str
) -> None:
    (actor,) = replica_actors(one_sequence)
    aborted = _stats(actor).aborted_total
    with stalled(actor, "bp-one") as (made, _):
        # Bounded by what may wait unread: Ray's window, the replica's pump, the engine's feed.
        assert made < UNREAD_BATCHES * 64 + 64 + 64 + 8 < MAX_TOKENS, made
    _aborted(actor, "bp-one", aborted)
    # The thread was released: the replica serves the next request.
    r = httpx.post(
        f"{gateway.url}/v1/completions",
        json={"model": one_sequence, "prompt": "Hi", "max_tokens": 3},
        timeout=300,
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def batched(gateway: GatewayProcess) -> Iterator[str]:
    spec = chat_spec(BATCHED, engine={"n_ctx": 2048, "n_threads": 1, "n_seq_max": 2})
    with deployed(gateway.url, spec) as name:
        yield name


@pytest.mark.timeout(900)  # STALL_DEADLINE_S on two busy cores
def test_the_batched_scheduler_pauses_a_stalled_sequence_and_serves_the_others(
    gateway: GatewayProcess, batched: str
) -> None:
    (actor,) = replica_actors(batched)
    aborted = _stats(actor).aborted_total
    with stalled(actor, "bp-batched") as (made, _):
        assert made < UNREAD_BATCHES * 64 + 64 + 64 + 8 < MAX_TOKENS, made
        # The other slot still decodes while the stalled sequence is paused.
        r = httpx.post(
            f"{gateway.url}/v1/completions",
            json={"model": batched, "prompt": "Hi", "max_tokens": 8},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    _aborted(actor, "bp-batched", aborted)
