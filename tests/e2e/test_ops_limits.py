"""Per-model admission (429 + Retry-After before the first byte) and timeouts (504 before headers,
an error event + [DONE] after), each ending the engine request. Fault test 4 of the issue."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.support.gateway import GatewayProcess
from tests.support.ops import ADMIN_KEY, metric, scrape, wait_for
from tests.support.replicas import replica_stats

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _gauges(url: str, model: str) -> tuple[float | None, float | None]:
    text = scrape(url)
    return (
        metric(text, "raygate:num_requests_running", model_name=model),
        metric(text, "raygate:num_requests_waiting", model_name=model),
    )


async def test_queue_overflow_gets_429_then_drains(ops_gateway: GatewayProcess) -> None:
    """synth-queue admits 2 running + 2 waiting; each request streams 20 tokens at 20/s."""
    url = ops_gateway.url
    engine_before = sum(s.requests_total for s in replica_stats("synth-queue"))
    body = {"model": "synth-queue", "prompt": "x", "max_tokens": 20}
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120) as c:
        admitted = [asyncio.create_task(c.post("/v1/completions", json=body)) for _ in range(4)]
        await asyncio.to_thread(
            wait_for, lambda: _gauges(url, "synth-queue") == (2, 2), 30, 0.05, "2 running + 2 waiting"
        )
        refused = await asyncio.gather(
            *(c.post("/v1/completions", json={**body, "stream": s}) for s in (False, True) * 3)
        )
        for r in refused:
            assert r.status_code == 429, r.text
            assert r.headers["content-type"] == "application/json"  # refused before any SSE byte
            assert r.json()["error"]["code"] == "queue_full"
            assert int(r.headers["retry-after"]) >= 1
        assert sum(s.requests_total for s in replica_stats("synth-queue")) - engine_before <= 2
        done = await asyncio.gather(*admitted)
        assert [r.status_code for r in done] == [200] * 4
        assert all(r.json()["usage"]["completion_tokens"] == 20 for r in done)
        # Nothing of the refused burst reached the engine; the gauges return to 0.
        assert sum(s.requests_total for s in replica_stats("synth-queue")) - engine_before == 4
        await asyncio.to_thread(
            wait_for, lambda: _gauges(url, "synth-queue") == (0, 0), 10, 0.1, "gauges at 0"
        )
        # Once drained, a burst that fits is served completely.
        again = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(4)))
        assert [r.status_code for r in again] == [200] * 4
    text = scrape(url)
    assert (
        metric(text, "raygate:requests_rejected_total", model_name="synth-queue", reason="queue_full") or 0
    ) >= 6
    # Two of the first four (and two of the second burst) queued for a slot.
    assert (metric(text, "raygate:request_queue_time_seconds_count", model_name="synth-queue") or 0) >= 8


def _engine_idle(model: str) -> bool:
    return all(s.running == 0 for s in replica_stats(model))


def test_ttft_timeout_is_504_and_aborts_the_engine(admin: httpx.Client) -> None:
    """synth-slow-start answers after 5 s; its limit is 0.5 s."""
    aborted = sum(s.aborted_total for s in replica_stats("synth-slow-start"))
    messages = [{"role": "user", "content": "x"}]
    for stream in (False, True):
        r = admin.post(
            "/v1/chat/completions", json={"model": "synth-slow-start", "messages": messages, "stream": stream}
        )
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "ttft_timeout"
    wait_for(lambda: _engine_idle("synth-slow-start"), 10, what="the engine to drop the requests")
    assert sum(s.aborted_total for s in replica_stats("synth-slow-start")) - aborted == 2


def test_total_timeout_mid_stream_is_an_error_event(admin: httpx.Client, ops_gateway: GatewayProcess) -> None:
    """synth-long makes 10 tokens/s and may take 1.5 s in all; 100 tokens would take 10 s."""
    aborted = sum(s.aborted_total for s in replica_stats("synth-long"))
    body = {"model": "synth-long", "prompt": "x", "max_tokens": 100, "stream": True}
    with admin.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "request_timeout" and error["type"] == "timeout_error"
    assert 1 <= len(data) - 2 < 100  # some tokens arrived before the limit
    r = admin.post("/v1/completions", json={**body, "stream": False})
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
    wait_for(lambda: _engine_idle("synth-long"), 10, what="the engine to drop the requests")
    assert sum(s.aborted_total for s in replica_stats("synth-long")) - aborted == 2
    # The openai SDK reports the in-band error as an APIError.
    with openai.OpenAI(base_url=f"{ops_gateway.url}/v1", api_key=ADMIN_KEY, max_retries=0) as c:
        with pytest.raises(openai.APIError, match="did not finish within"):
            for _ in c.completions.create(model="synth-long", prompt="x", max_tokens=100, stream=True):
                pass
