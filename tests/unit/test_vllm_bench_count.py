"""bench/vllm_bench.py's tokens/s: each completed request's 128 tokens over the cell's duration, not
vLLM's client's count, which re-tokenizes llama-server's text (its usage rides on a chunk the
client skips) and comes out a few percent short. The numbers are one recorded llama-server cell."""

from __future__ import annotations

import pytest

from bench.vllm_bench import OUTPUT_TOKENS, served_throughput, summarize

# 14 of 16 requests completed (two refused on a closed keep-alive connection, before any
# response); the client counted 1,742 tokens for them where the server made 14 x 128 = 1,792.
PEER = {"completed": 14, "failed": 2, "total_output_tokens": 1742, "output_throughput": 89.7}
DURATION = 1742 / 89.7


def test_every_completed_request_counts_its_output_tokens() -> None:
    assert served_throughput(PEER) == pytest.approx(14 * OUTPUT_TOKENS / DURATION)
    assert served_throughput({**PEER, "duration": 10.0}) == pytest.approx(14 * OUTPUT_TOKENS / 10.0)


def test_the_ratios_use_the_served_count_and_the_clients_stays_beside_it() -> None:
    ours = {"completed": 16, "failed": 0, "total_output_tokens": 2048, "output_throughput": 88.6}
    metrics = {"median_ttft_ms": 100.0, "p90_itl_ms": 8.0, "p99_itl_ms": 10.0}
    cell = {"round": 1, "workload": "prefix", "concurrency": 1}
    runs = [{**cell, **metrics, **PEER, "target": "peer"}, {**cell, **metrics, **ours, "target": "us"}]
    rows = {
        line.split(" | ")[2]: line.split(" | ") for line in summarize(runs, ["peer", "us"]).splitlines()[2:]
    }
    assert rows["peer"][3].startswith(f"{served_throughput(PEER):.1f} ")  # tok/s: 92.3, not 89.7
    assert rows["peer"][4].startswith("89.7 ")  # the client's own number
    assert rows["us"][-1].startswith(f"{88.6 / served_throughput(PEER):.2f}")  # the ratio to 92.3
