"""Footprint: `make serve` against llama-server with the same slots, idle after traffic, every
process counted.

    python -m bench.footprint               # 300 requests each (also run by `make bench`)
    python -m bench.footprint --requests 40 # a quick check

The servers start side by side: `raygate serve` with `models/default.yaml` (what `make serve`
runs: the chat model, 8 sequences per decode, and the embedding model) and llama-server on the
same GGUF with the bench's flags (`-np 8`, `-c` = 8 x n_ctx), as its users run it and with
`--cache-ram` equal to Raygate's prompt store (`EQUAL_CACHE`). Each gets the same streamed
completions at c=8, the first half new prompts, the second half a shared ~300-token opening with a
new question each (so the replica's host copies of evicted slots, `prompt_cache_ram_mib`, fill as
llama-server's `--cache-ram` does); then all idle `--settle` seconds and every process is read.

Raygate's processes are the gateway and everything below it (Ray's GCS, raylet, agents, workers,
replicas, the watchdog).
RSS double-counts pages that processes share (Python's and Ray's libraries); PSS splits them, so
both are reported. Written to bench/results/footprint-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import plan, servers
from bench.client import Workload, run_http
from bench.run import _llama_server_command, _llama_settings
from raygate.backends.engines.llama_cpp.model import DEFAULT_PROMPT_CACHE_RAM_MIB
from raygate.server.settings import DEFAULT_CONFIG

log = logging.getLogger("bench")
RESULTS = Path(__file__).resolve().parent / "results"
# llama-server keeps evicted slots' states in host memory up to `--cache-ram` (8,192 MiB by
# default: what its users run, and it grows with the traffic); Raygate's replica up to
# `prompt_cache_ram_mib` (128 MiB by default). The second peer row holds the same as Raygate.
EQUAL_CACHE = f"llama-server --cache-ram {int(DEFAULT_PROMPT_CACHE_RAM_MIB)}"
REQUESTS = 300
CONCURRENCY = 8
MAX_TOKENS = 16
SETTLE_S = 10.0


def _kib(pid: int, field: str, source: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/{source}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def processes(root: int) -> list[dict[str, Any]]:
    """`root` and every process below it: pid, name, RSS and PSS in MB."""
    rows = []
    for pid in sorted({root, *servers.descendants(root)}):
        rss = _kib(pid, "VmRSS", "status")
        if not rss:
            continue  # gone, or a kernel thread
        # Ray names its workers in their command line (`ray::ModelWorker`, padded with spaces).
        line = servers.cmdline(pid).strip()
        name = line.split()[0] if line.startswith("ray::") else line.split(" --")[0][-70:]
        pss = _kib(pid, "Pss", "smaps_rollup")
        rows.append({"pid": pid, "name": name, "rss_mb": rss / 1024, "pss_mb": pss / 1024})
    return rows


def _workloads() -> list[Workload]:
    new = plan.WORKLOADS["llama"]
    shared = plan.WORKLOADS["llama-shared-new"]
    return [
        Workload("/completions", {**body, "max_tokens": MAX_TOKENS}, None, unique=True)
        for body in (new, shared)
    ]


async def _traffic(url: str, requests: int) -> int:
    failed = 0
    for workload in _workloads():
        results, _ = await run_http(
            url + "/v1", workload, concurrency=CONCURRENCY, requests=requests // 2, max_seconds=300
        )
        failed += sum(not r.ok for r in results)
    return failed


def run(requests: int, settle_s: float, log_dir: Path) -> dict[str, Any]:
    gguf, engine = _llama_settings()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    commands = {
        "make serve": [
            str(servers.BIN / "raygate"),
            "serve",
            "--config",
            str(DEFAULT_CONFIG),
            "--port",
            servers.PORT,
        ],
        "llama-server": _llama_server_command(gguf, int(engine.get("n_ctx", 2048))),
        EQUAL_CACHE: [
            *_llama_server_command(gguf, int(engine.get("n_ctx", 2048))),
            "--cache-ram",
            str(int(DEFAULT_PROMPT_CACHE_RAM_MIB)),
        ],
    }
    health = {"make serve": "/ready", "llama-server": "/health", EQUAL_CACHE: "/health"}
    procs = {
        name: servers.start(name, argv, log_dir / f"{name.replace(' ', '-')}.log", env)
        for name, argv in commands.items()
    }
    record: dict[str, Any] = {
        "started": time.time(),
        "requests": requests,
        "settle_s": settle_s,
        "targets": {},
    }
    try:
        for name, server in procs.items():
            servers.wait_healthy(server, health[name], timeout=600)
        for name, server in procs.items():
            log.info("%s: %d requests", name, requests)
            failed = asyncio.run(_traffic(server.url, requests))
            record["targets"][name] = {"failed": failed}
        time.sleep(settle_s)
        for name, server in procs.items():
            rows = processes(server.proc.pid)
            record["targets"][name].update(
                processes=rows,
                rss_mb=sum(r["rss_mb"] for r in rows),
                pss_mb=sum(r["pss_mb"] for r in rows),
            )
        record["load"] = os.getloadavg()
    finally:
        for server in procs.values():
            server.stop()
    return record


def markdown(record: dict[str, Any]) -> str:
    targets = record["targets"]
    ours = targets["make serve"]
    lines = [
        f"Footprint idle after {record['requests']} requests each (c={CONCURRENCY}, {MAX_TOKENS} tokens), "
        f"load {record['load'][0]:.1f}",
        "",
        "| target | processes | RSS MB | PSS MB | failed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, t in targets.items():
        lines.append(
            f"| {name} | {len(t['processes'])} | {t['rss_mb']:.0f} | {t['pss_mb']:.0f} | {t['failed']} |"
        )
    for name, peer in targets.items():
        if name != "make serve":
            lines.append(
                f"| make serve / {name} | | **{ours['rss_mb'] / peer['rss_mb']:.2f}×** | "
                f"**{ours['pss_mb'] / peer['pss_mb']:.2f}×** | |"
            )
    lines += ["", "| make serve's process | RSS MB | PSS MB |", "| --- | --- | --- |"]
    lines += [f"| {r['name']} | {r['rss_mb']:.0f} | {r['pss_mb']:.0f} |" for r in ours["processes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--settle", type=float, default=SETTLE_S, help="idle seconds before reading")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="a folder: footprint-<date>.json and .md go in it"
    )
    args = parser.parse_args(argv)
    if args.out.suffix in (".json", ".md"):
        parser.error("--out is a folder (the files are named footprint-<date>.json and .md)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="raygate-footprint-") as logs:
        record = run(args.requests, args.settle, Path(logs))
    date = time.strftime("%Y-%m-%d", time.localtime(record["started"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"footprint-{date}.json").write_text(json.dumps(record, indent=1) + "\n")
    table = markdown(record)
    (args.out / f"footprint-{date}.md").write_text(f"# `python -m bench.footprint`, {date}\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
