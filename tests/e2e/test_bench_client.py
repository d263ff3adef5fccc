"""The benchmark's load client (bench/client.py) and its split of a decode step (bench/forward.py)
against real servers; the metric arithmetic itself is tests/unit/test_bench_metrics.py.

Speed is never asserted here: the smoke run only checks that the client measures a real server
(the synthetic engine behind Raygate's HTTP layer) and counts what it should.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import openai
import pytest

from bench import servers
from bench.client import Workload, run_http
from bench.metrics import summarize
from tests.support.gateway import REPO, GatewayProcess
from tests.support.models import CHAT_MODEL

SYNTHETIC_CONFIG = REPO / "tests" / "configs" / "synthetic.yaml"


@pytest.fixture(scope="module")
def synthetic_l1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Raygate's HTTP layer with the synthetic engine in-process (bench's L1 app): no Ray, fast."""
    argv = [
        str(servers.BIN / "python"),
        "-m",
        "bench.inproc_app",
        "--config",
        str(SYNTHETIC_CONFIG),
        "--port",
        servers.PORT,
        "--log-level",
        "warning",
    ]
    server = servers.start("l1-synthetic", argv, tmp_path_factory.mktemp("bench") / "l1-synthetic.log")
    try:
        servers.wait_healthy(server, "/health", timeout=60)
        yield server.url + "/v1"
    finally:
        assert server.stop() in (0, -15)


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_client_smoke_against_synthetic_engine(synthetic_l1: str, path: str) -> None:
    body: dict[str, object] = {
        "model": "paced",
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body |= {"prompt": "hi"} if path == "/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    results, wall = asyncio.run(
        run_http(synthetic_l1, Workload(path, body, 16), concurrency=3, requests=6, max_seconds=30)
    )
    s = summarize(results, wall)
    assert (s.completed, s.failures, s.output_tokens) == (6, {}, 96)
    assert all(len(r.chunk_times) == 16 for r in results)  # one text chunk per synthetic token
    assert s.ttft_ms["p50"] >= 10  # the engine's own 10 ms before the first token
    assert s.itl_ms["p50"] >= 1  # and 2 ms between tokens: nothing arrives early


def test_in_process_app_serves_a_llama_model(synthetic_l1: str) -> None:
    """L1 admits a llama.cpp model's requests through the gateway's own admission, which sizes the
    model's gate by its engines (the bench's `llama-c1` L1 row). Tokens are counted from usage, as
    the bench asks for it: a real model's token can carry no text of its own (part of a UTF-8
    character, held until the rest arrives), so text chunks may be fewer than tokens."""
    body = {
        "model": CHAT_MODEL,
        "prompt": "Hello",
        "max_tokens": 4,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    results, wall = asyncio.run(
        run_http(synthetic_l1, Workload("/completions", body, 4), concurrency=2, requests=2, max_seconds=60)
    )
    s = summarize(results, wall)
    assert (s.completed, s.failures, s.output_tokens) == (2, {}, 8)


def test_client_counts_failures_by_status(synthetic_l1: str) -> None:
    unknown = {"model": "nope", "prompt": "hi", "stream": True}
    short = {"model": "paced", "prompt": "hi", "max_tokens": 4, "stream": True}
    bad, _ = asyncio.run(
        run_http(synthetic_l1, Workload("/completions", unknown), concurrency=1, requests=2, max_seconds=30)
    )
    few, _ = asyncio.run(
        run_http(synthetic_l1, Workload("/completions", short, 8), concurrency=1, requests=1, max_seconds=30)
    )
    assert summarize(bad).failures == {"404": 2}
    assert summarize(few).failures == {"incomplete": 1}


def test_forward_passes_are_read_off_a_real_gateway(gateway: GatewayProcess, client: openai.OpenAI) -> None:
    """bench/forward.py's split of a decode step comes from the gateway's own counters for the chat
    model (and llama-server's `llamacpp:n_decode_total` line)."""
    import httpx

    from bench import forward

    before = forward.parse(httpx.get(f"{gateway.url}/metrics").text, CHAT_MODEL)
    began = time.perf_counter()
    client.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    wall = time.perf_counter() - began  # the passes ran within the request
    after = forward.parse(httpx.get(f"{gateway.url}/metrics").text, CHAT_MODEL)
    totals: dict[str, float] = {}
    forward.add(totals, before, after)
    assert totals["tokens"] >= totals["passes"] >= 1 and totals["seconds"] > 0
    split = forward.summary(totals, wall_s=wall)
    assert 0 < split["compute_ms_per_pass"] <= split["wall_ms_per_pass"]
    assert forward.parse(
        "# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total 12\n", CHAT_MODEL
    ) == {"passes": 12.0}
