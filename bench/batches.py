"""Batches behind interactive traffic (L2, issue 48): does a running batch cost interactive
requests their latency, and how much of the spare decode capacity does it use?

Three closed loops of streamed chat requests on the full gateway, each `SECONDS` long:

1. interactive alone, c=4: TTFT p50 and output tokens/s;
2. capacity, c=8 (every decode slot of the bench's batched model): the tokens/s the cores give;
3. interactive c=4 again while a `LINES`-line chat batch runs: TTFT p50, and the batch's tokens/s
   over the same window (the gateway's `generation_tokens_total` delta minus the loop's own).

Targets (issue 48): TTFT p50 with the batch within 1.2x of alone; batch tokens/s at least 80 % of
what the cores have left (capacity - interactive tokens/s during the window). The batch is
cancelled once the window ends (its remaining lines are not this row's business). Part of
`python -m bench` (`--only batches` runs it alone); `python -m bench.batches --url URL` runs it
against a gateway of your own.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import time
from typing import Any

import httpx

from bench.client import Workload, run_http
from bench.metrics import summarize
from bench.prometheus import metric

log = logging.getLogger("bench")

MODEL = "smollm2-batched"  # bench/configs/bench.yaml: 4 sequences per decode, 2 replicas
LINES = 1000
SECONDS = 60.0
CONCURRENCY = 4
CAPACITY_CONCURRENCY = 8
MAX_TOKENS = 32
QUICK = {"lines": 20, "seconds": 8.0}


def workload(model: str) -> Workload:
    return Workload(
        "/chat/completions",
        {
            "model": model,
            "messages": [{"role": "user", "content": "Name three rivers in Europe."}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )


def batch_file(model: str, lines: int) -> bytes:
    rows = [
        {
            "custom_id": f"bench-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Write a sentence about the number {i}."}],
                "max_tokens": MAX_TOKENS,
            },
        }
        for i in range(lines)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def generated(url: str, model: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return metric(text, "raygate:generation_tokens_total", model_name=model) or 0.0


async def _loop(url: str, model: str, concurrency: int, seconds: float) -> dict[str, Any]:
    results, wall = await run_http(
        f"{url}/v1", workload(model), concurrency=concurrency, requests=10**9, max_seconds=seconds
    )
    summary = summarize(results, wall)
    return {
        "concurrency": concurrency,
        "completed": summary.completed,
        "failures": summary.failures,
        "ttft_p50_ms": summary.ttft_ms["p50"],
        "output_tokens": summary.output_tokens,
        "tokens_per_s": summary.output_throughput,
        "seconds": wall,
    }


async def measure(
    url: str, lines: int = LINES, seconds: float = SECONDS, model: str = MODEL
) -> dict[str, Any]:
    alone = await _loop(url, model, CONCURRENCY, seconds)
    log.info("batches: interactive alone, TTFT p50 %.0f ms", alone["ttft_p50_ms"])
    capacity = await _loop(url, model, CAPACITY_CONCURRENCY, seconds)
    log.info("batches: capacity %.1f tokens/s", capacity["tokens_per_s"])

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        uploaded = await http.post(
            "/v1/files",
            files={"file": ("bench.jsonl", io.BytesIO(batch_file(model, lines)))},
            data={"purpose": "batch"},
        )
        uploaded.raise_for_status()
        body = {
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        created = await http.post("/v1/batches", json=body)
        created.raise_for_status()
        batch_id = created.json()["id"]
        # Wait for its first answer: the window measures a batch that runs.
        deadline = time.monotonic() + 300
        while (await http.get(f"/v1/batches/{batch_id}")).json()["request_counts"]["completed"] < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the batch did not start")
            await asyncio.sleep(0.2)
        before = await asyncio.to_thread(generated, url, model)
        started = time.perf_counter()
        during = await _loop(url, model, CONCURRENCY, seconds)
        window = time.perf_counter() - started
        after = await asyncio.to_thread(generated, url, model)
        batch = (await http.get(f"/v1/batches/{batch_id}")).json()
        await http.post(f"/v1/batches/{batch_id}/cancel")

    batch_tokens = max(0.0, after - before - during["output_tokens"])
    batch_tps = batch_tokens / window
    left = max(capacity["tokens_per_s"] - during["tokens_per_s"], 1e-9)
    row = {
        "model": model,
        "lines": lines,
        "seconds": seconds,
        "alone": alone,
        "capacity": capacity,
        "with_batch": during,
        "batch_lines_done": batch["request_counts"]["completed"] + batch["request_counts"]["failed"],
        "batch_tokens_per_s": batch_tps,
        "ttft_ratio": during["ttft_p50_ms"] / alone["ttft_p50_ms"],
        "spare_used": batch_tps / left,
    }
    log.info(
        "batches: TTFT p50 %.0f -> %.0f ms (x%.2f), batch %.1f tokens/s = %.0f %% of the spare %.1f",
        alone["ttft_p50_ms"],
        during["ttft_p50_ms"],
        row["ttft_ratio"],
        batch_tps,
        100 * row["spare_used"],
        left,
    )
    return row


def markdown(row: dict[str, Any]) -> str:
    return "\n".join(
        [
            "| batches (L2) | TTFT p50 alone | TTFT p50 with batch | ratio (≤ 1.2) | capacity tok/s "
            "| interactive tok/s with batch | batch tok/s | spare used (≥ 80 %) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {row['model']}, c={CONCURRENCY}, {row['lines']} lines, {row['seconds']:.0f} s "
            f"| {row['alone']['ttft_p50_ms']:.0f} ms | {row['with_batch']['ttft_p50_ms']:.0f} ms "
            f"| {row['ttft_ratio']:.2f} | {row['capacity']['tokens_per_s']:.1f} "
            f"| {row['with_batch']['tokens_per_s']:.1f} | {row['batch_tokens_per_s']:.1f} "
            f"| {100 * row['spare_used']:.0f} % |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a running gateway, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--lines", type=int, default=LINES)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--quick", action="store_true", help="20 lines, 8 s loops: check that it runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    lines, seconds = (QUICK["lines"], QUICK["seconds"]) if args.quick else (args.lines, args.seconds)
    row = asyncio.run(measure(args.url.rstrip("/"), int(lines), float(seconds), args.model))
    print(json.dumps(row, indent=1))
    print(markdown(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
