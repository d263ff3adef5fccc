"""`python -m bench` (what `make bench` runs): the default plan, then
bench/results/<date>.json, <date>.png and <date>.md (the Markdown tables, also on stdout).

    python -m bench                      # the default set (< 10 minutes on 2 cores)
    python -m bench --quick              # every step with tiny counts (a smoke run)
    python -m bench --only instant paced # some scenarios only
    python -m bench --only rerank        # the rerank row only (documents/s, bench/rerank.py)
    python -m bench --only batches       # interactive TTFT with and without a batch (bench/batches.py)
    python -m bench --only vllm          # opt-in: the vLLM engine vs `vllm serve` (bench/vllm_serve.py)
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
import time
from pathlib import Path

from bench import batches, chart, plan, report, rerank, vllm_serve
from bench.run import run

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny counts: check that every step runs")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="SCENARIO",
        choices=[s.name for s in plan.SCENARIOS] + ["rerank", "batches", "vllm"],
    )
    parser.add_argument("--memory-requests", type=int, default=None, help="0 skips the memory run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for <date>.json and .png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    scenarios = tuple(s for s in plan.SCENARIOS if not args.only or s.name in args.only)
    if args.quick:
        scenarios = plan.quick(scenarios)
    memory = args.memory_requests
    if memory is None:
        memory = 0 if args.only else (200 if args.quick else plan.MEMORY_REQUESTS)

    with_rerank = not args.only or "rerank" in args.only
    batch_row = None
    if not args.only or "batches" in args.only:
        batch_row = (
            dict(batches.QUICK)
            if args.quick
            else {"lines": batches.LINES, "seconds": batches.SECONDS, "rounds": batches.ROUNDS}
        )
    with tempfile.TemporaryDirectory(prefix="raygate-bench-") as logs:
        record = run(scenarios, Path(logs), memory, with_rerank, batch_row)
        if args.only and "vllm" in args.only:  # opt-in (minutes per round); its servers start alone
            record["vllm"] = vllm_serve.run_rounds(Path(logs), quick=args.quick)
    record["date"] = time.strftime("%Y-%m-%d", time.localtime(record["started"]))
    record["command"] = shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])])
    rows = report.evaluate(record)
    record["targets"] = report.as_json(rows)

    args.out.mkdir(parents=True, exist_ok=True)
    stem = record["date"] + ("-quick" if args.quick else "") + ("-partial" if args.only else "")
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    json_path.write_text(json.dumps(record, indent=1, default=float) + "\n")
    tables = f"{report.markdown_targets(rows)}\n\n{report.markdown_runs(record)}\n"
    if record.get("rerank"):
        tables += f"\n{rerank.markdown(record['rerank'])}\n"
    if record.get("batches"):
        tables += f"\n{batches.markdown(record['batches'])}\n"
    if record.get("vllm"):
        tables += f"\n{vllm_serve.markdown(record['vllm'])}\n"
    (args.out / f"{stem}.md").write_text(f"# `{record['command']}`, {record['date']}\n\n{tables}")
    print(tables)
    try:  # last: the numbers are written whether or not a chart can be drawn
        chart.render(record, png_path)
    except ImportError as exc:  # `make bench` installs it; a bare `make setup` venv has none
        print(f"no chart ({exc}): pip install -e '.[bench]'")
    print(f"wrote {json_path}, .md and .png in {record['duration_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
