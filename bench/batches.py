"""Batches behind interactive traffic (L2, issue 48): does a running batch cost interactive
requests their latency, and how much of the spare decode capacity does it use?

Closed loops of streamed chat requests on the full gateway, each `SECONDS` long:

- capacity, c=8 (every decode slot of the bench's batched model): the tokens/s the cores give,
  measured first and last (the machine's load moves; the row takes their median);
- `ROUNDS` rounds of: interactive alone, c=4 (TTFT p50, tokens/s); then a `LINES`-line chat batch
  is submitted, and once its first line is back, interactive c=4 again over the same window
  length: TTFT p50, and the batch's tokens/s (the gateway's `generation_tokens_total` delta
  minus the loop's own); the batch is then cancelled and its lines in flight drained, so the
  next "alone" runs alone. Alone and with alternate, so a change in the machine's load hits both.

The two targets (issue 48), per round and as the median over rounds (with their spread):
`ttft_ratio` = TTFT p50 with the batch / alone (target <= 1.2), and `spare_used` = batch tokens/s /
(capacity - interactive tokens/s with the batch) (target >= 0.8). Part of `python -m bench`
(`--only batches` runs it alone); `python -m bench.batches --url URL` runs it against a gateway
of your own.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import statistics
import time
from typing import Any

import httpx

from bench.client import Workload, run_http
from bench.metrics import summarize
from bench.prometheus import metric

log = logging.getLogger("bench")

MODEL = "smollm2-batched"  # bench/configs/bench.yaml: 4 sequences per decode, 2 replicas
LINES = 1000
SECONDS = 40.0
CONCURRENCY = 4
CAPACITY_CONCURRENCY = 8
MAX_TOKENS = 32
# Each interactive request's length, drawn (mean `MAX_TOKENS`): with every request 32 tokens long,
# two clients on one replica whose requests once started in the same decode ended in the same
# decode and came back together for ever after, each waiting for the other's prompt. A running
# batch makes decodes longer and so such pairs likelier: 42-61 % of the interactive requests
# were admitted together with another with the batch, 1-5 % without (measured per request in the
# engine, 4 runs). That is an artifact of identical requests; real ones differ in length.
LENGTHS = (16, 48)
ROUNDS = 3
QUICK = {"lines": 20, "seconds": 8.0, "rounds": 1}


def workload(model: str, unique: bool = True) -> Workload:
    """The interactive loop's request. `unique` (the default): each request's message starts with
    its own number, as real users' prompts differ; with one repeated prompt the engine draws every
    first token from the logits it kept (`kept_logits.py`), so "alone" measures no engine work at all
    and any work a batch adds shows as the whole of the TTFT (`--repeated`)."""
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
        unique=unique,
        max_tokens_between=LENGTHS,
    )


def batch_file(model: str, lines: int) -> bytes:
    """`lines` lines, each the interactive loop's own request (a prompt with a number of its own,
    greedy, a length drawn from `LENGTHS`), answered whole. The batch is measured against the capacity of that
    request; lines of another kind (a sampled sentence that ends after ~24 tokens, as this row
    once used) spend more prompt work per generated token, so their tokens/s would be measured
    against the wrong yardstick."""
    next_body = workload(model).payloads()
    rows = []
    for i in range(lines):
        body = json.loads(next_body())
        body.pop("stream", None)
        body.pop("stream_options", None)
        line = {"custom_id": f"bench-{i}", "method": "POST", "url": "/v1/chat/completions"}
        rows.append({**line, "body": body})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def generated(url: str, model: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return metric(text, "raygate:generation_tokens_total", model_name=model) or 0.0


async def _loop(
    url: str, model: str, concurrency: int, seconds: float, unique: bool = True
) -> dict[str, Any]:
    results, wall = await run_http(
        f"{url}/v1", workload(model, unique), concurrency=concurrency, requests=10**9, max_seconds=seconds
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


async def _batch(http: httpx.AsyncClient, model: str, lines: int) -> str:
    """Upload and create a `lines`-line chat batch; returns its id once its first line is back."""
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
    batch_id: str = created.json()["id"]
    deadline = time.monotonic() + 300
    while (await http.get(f"/v1/batches/{batch_id}")).json()["request_counts"]["completed"] < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the batch did not start")
        await asyncio.sleep(0.2)
    return batch_id


async def _cancel(http: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    """Cancel the batch and wait until its lines in flight are done (status `cancelled`)."""
    await http.post(f"/v1/batches/{batch_id}/cancel")
    deadline = time.monotonic() + 300
    while (batch := (await http.get(f"/v1/batches/{batch_id}")).json())["status"] == "cancelling":
        if time.monotonic() > deadline:
            raise TimeoutError("the batch did not finish cancelling")
        await asyncio.sleep(0.2)
    result: dict[str, Any] = batch
    return result


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def measure(
    url: str,
    lines: int = LINES,
    seconds: float = SECONDS,
    model: str = MODEL,
    rounds: int = ROUNDS,
    unique: bool = True,
) -> dict[str, Any]:
    capacities = [await _loop(url, model, CAPACITY_CONCURRENCY, seconds, unique)]
    log.info("batches: capacity %.1f tokens/s", capacities[0]["tokens_per_s"])
    runs: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        for i in range(rounds):
            load_before = os.getloadavg()[0]
            alone = await _loop(url, model, CONCURRENCY, seconds, unique)
            batch_id = await _batch(http, model, lines)
            before = await asyncio.to_thread(generated, url, model)
            started = time.perf_counter()
            during = await _loop(url, model, CONCURRENCY, seconds, unique)
            window = time.perf_counter() - started
            after = await asyncio.to_thread(generated, url, model)
            batch = await _cancel(http, batch_id)
            batch_tps = max(0.0, after - before - during["output_tokens"]) / window
            runs.append(
                {
                    "alone": alone,
                    "with_batch": during,
                    "batch_lines_done": batch["request_counts"]["completed"]
                    + batch["request_counts"]["failed"],
                    "batch_tokens_per_s": batch_tps,
                    "ttft_ratio": during["ttft_p50_ms"] / alone["ttft_p50_ms"],
                    "loadavg_1m": [load_before, os.getloadavg()[0]],
                }
            )
            log.info(
                "batches round %d: TTFT p50 %.0f -> %.0f ms (x%.2f), batch %.1f tokens/s, load %.1f",
                i + 1,
                alone["ttft_p50_ms"],
                during["ttft_p50_ms"],
                runs[-1]["ttft_ratio"],
                batch_tps,
                os.getloadavg()[0],
            )
    capacities.append(await _loop(url, model, CAPACITY_CONCURRENCY, seconds, unique))
    capacity = statistics.median(c["tokens_per_s"] for c in capacities)
    for run in runs:
        left = max(capacity - run["with_batch"]["tokens_per_s"], 1e-9)
        run["spare_tokens_per_s"] = left
        run["spare_used"] = run["batch_tokens_per_s"] / left
    row = {
        "model": model,
        "prompts": "unique" if unique else "repeated",
        "lengths": f"{LENGTHS[0]}-{LENGTHS[1]}",
        "lines": lines,
        "seconds": seconds,
        "rounds": runs,
        "capacity": capacities,
        "capacity_tokens_per_s": capacity,
        "ttft_p50_alone_ms": _spread([r["alone"]["ttft_p50_ms"] for r in runs]),
        "ttft_p50_with_batch_ms": _spread([r["with_batch"]["ttft_p50_ms"] for r in runs]),
        "ttft_ratio": _spread([r["ttft_ratio"] for r in runs]),
        "batch_tokens_per_s": _spread([r["batch_tokens_per_s"] for r in runs]),
        "interactive_tokens_per_s_with_batch": _spread([r["with_batch"]["tokens_per_s"] for r in runs]),
        "spare_used": _spread([r["spare_used"] for r in runs]),
        "loadavg_1m": _spread([x for r in runs for x in r["loadavg_1m"]]),
    }
    log.info(
        "batches: TTFT ratio %.2f (%.2f-%.2f; target <= 1.2), "
        "spare used %.0f %% (%.0f-%.0f %%; target >= 80 %%)",
        row["ttft_ratio"]["median"],
        row["ttft_ratio"]["min"],
        row["ttft_ratio"]["max"],
        100 * row["spare_used"]["median"],
        100 * row["spare_used"]["min"],
        100 * row["spare_used"]["max"],
    )
    return row


def markdown(row: dict[str, Any]) -> str:
    def spread(stat: dict[str, float], fmt: str = "{:.2f}", scale: float = 1.0) -> str:
        return " ".join(
            [
                fmt.format(scale * stat["median"]),
                f"({fmt.format(scale * stat['min'])}-{fmt.format(scale * stat['max'])})",
            ]
        )

    return "\n".join(
        [
            "| batches (L2), median (min-max) of rounds | TTFT p50 alone | TTFT p50 with batch "
            "| ratio (≤ 1.2) "
            "| capacity tok/s | interactive tok/s with batch | batch tok/s | spare used (≥ 80 %) | load 1m |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {row['model']}, c={CONCURRENCY}, {row['prompts']} prompts, "
            f"{row.get('lengths', 'all 32')} tokens, {row['lines']} lines, "
            f"{len(row['rounds'])} x {row['seconds']:.0f} s "
            f"| {spread(row['ttft_p50_alone_ms'], '{:.0f}')} ms "
            f"| {spread(row['ttft_p50_with_batch_ms'], '{:.0f}')} ms "
            f"| {spread(row['ttft_ratio'])} | {row['capacity_tokens_per_s']:.1f} "
            f"| {spread(row['interactive_tokens_per_s_with_batch'], '{:.1f}')} "
            f"| {spread(row['batch_tokens_per_s'], '{:.1f}')} "
            f"| {spread(row['spare_used'], '{:.0f}', 100)} % | {spread(row['loadavg_1m'], '{:.0f}')} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a running gateway, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--lines", type=int, default=LINES)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="alone / with-batch rounds")
    parser.add_argument(
        "--repeated", action="store_true", help="one repeated interactive prompt (kept logits)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="20 lines, 8 s loops, 1 round: check that it runs"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    quick = QUICK if args.quick else {"lines": args.lines, "seconds": args.seconds, "rounds": args.rounds}
    row = asyncio.run(
        measure(
            args.url.rstrip("/"),
            int(quick["lines"]),
            float(quick["seconds"]),
            args.model,
            int(quick["rounds"]),
        )
    )
    print(json.dumps(row, indent=1))
    print(markdown(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
