"""What happens around a stream: disconnects reach the engine, replicas share the load, curl works
(tests/support/suites/streaming.py, which tests/e2e/vllm reruns)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.support.models import CHAT_MODEL
from tests.support.replicas import replica_stats
from tests.support.suites.streaming import test_curl_streaming  # noqa: F401

# Only the client's disconnect may end it: where the greedy count stops by itself moves with the
# CPU, and a stop before the gateway saw the client go would leave nothing to abort.
LONG = {
    "model": CHAT_MODEL,
    "prompt": "Count upwards forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "max_tokens": 1500,
    "ignore_eos": True,
    "temperature": 0,
    "stream": True,
}


def test_disconnect_aborts_engine(base_url: str) -> None:
    before = replica_stats(CHAT_MODEL)
    events = 0
    with httpx.stream("POST", f"{base_url}/completions", json=LONG, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events += 1
                if events == 3:
                    break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = replica_stats(CHAT_MODEL)
        if sum(s.running for s in after) == 0 and sum(s.aborted_total for s in after) > sum(
            s.aborted_total for s in before
        ):
            break
        time.sleep(0.1)
    aborted = sum(s.aborted_total for s in after) - sum(s.aborted_total for s in before)
    generated = sum(s.tokens_generated_total for s in after) - sum(s.tokens_generated_total for s in before)
    assert aborted == 1, (before, after)
    assert sum(s.running for s in after) == 0
    assert generated < 1500, "the engine kept decoding after the client left"


def test_disconnect_aborts_a_non_streamed_request(base_url: str) -> None:
    """A client that gives up on a non-streamed answer (its timeout, a closed tab) must not leave
    the engine decoding 1,500 tokens for nobody."""
    before = replica_stats(CHAT_MODEL)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{base_url}/completions", json={**LONG, "stream": False}, timeout=httpx.Timeout(60, read=1.5)
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = replica_stats(CHAT_MODEL)
        if sum(s.running for s in after) == 0:
            break
        time.sleep(0.1)
    aborted = sum(s.aborted_total for s in after) - sum(s.aborted_total for s in before)
    generated = sum(s.tokens_generated_total for s in after) - sum(s.tokens_generated_total for s in before)
    assert aborted == 1 and sum(s.running for s in after) == 0, (before, after)
    assert generated < 1500, "the engine kept decoding after the client left"


async def test_sixteen_concurrent_streams_on_an_eight_sequence_replica(
    async_client: openai.AsyncOpenAI,
) -> None:
    """Twice as many streams as the default chat replica decodes at once: every one completes, and
    the replica counts each exactly once (spreading over replicas: test_admin_api)."""
    before = replica_stats(CHAT_MODEL)
    assert len(before) == 1

    async def one(i: int) -> tuple[str, str | None]:
        stream = await async_client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": f"Say a word about the number {i}."}],
            max_tokens=8,
            stream=True,
        )
        text, finish = [], None
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return "".join(text), finish

    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(16))), timeout=240)
    assert all(finish in ("stop", "length") for _, finish in results)
    assert sum(1 for text, _ in results if text) >= 15
    after = replica_stats(CHAT_MODEL)
    served = [a.requests_total - b.requests_total for a, b in zip(after, before, strict=True)]
    assert served == [16], served
