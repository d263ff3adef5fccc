"""Runs the plan: starts every target at once, drives the scenarios side by side, then the memory
run, and returns one JSON-able record. Servers are stopped (by their own PIDs) however it ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import batches, forward, llama_server, plan, rerank, servers
from bench.client import Runner, Workload, http_worker_factory, run_closed_loop
from bench.engine_runner import engine_worker_factory, load_engine
from bench.metrics import RequestResult, summarize
from raygate.backends.engines.base import Engine
from raygate.backends.engines.model_files import resolve_model_file
from raygate.server.config_file import load_config
from raygate.server.settings import DEFAULT_CONFIG

log = logging.getLogger("bench")

CONFIG = servers.REPO / "bench" / "configs" / "bench.yaml"
WorkerFactory = Callable[[], Awaitable[tuple[Runner, Callable[[], Awaitable[None]]]]]


@dataclass
class Targets:
    """Where each target is reachable; `engine` is the in-process L0 engine."""

    urls: dict[str, str] = field(default_factory=dict)
    procs: dict[str, servers.Server] = field(default_factory=dict)
    engine: Engine | None = None
    llama_threads: int = 1
    warm: set[tuple[str, str]] = field(default_factory=set)
    log_dir: Path = Path(".")
    serving: str | None = None  # the SOLO_TARGETS shape the `serve` gateway has now
    rss: dict[str, dict[str, Any]] = field(default_factory=dict)  # per target, see run_scenario
    # Forward passes per (scenario, target, concurrency) over its runs, where the server counts them.
    forward: dict[tuple[str, str, int], dict[str, float]] = field(default_factory=dict)

    def counts_passes(self, target: str) -> bool:
        """`make serve`'s shapes (the chat model's `raygate:forward_*`) and the llama-servers."""
        return target in plan.SOLO_TARGETS or target in plan.LLAMA_SERVERS

    def factory(self, target: str, workload: str) -> WorkerFactory:
        if target == "L0":
            assert self.engine is not None and workload == "llama"
            return engine_worker_factory(self.engine, plan.LLAMA_PROMPT, plan.L0_SAMPLING, plan.OUTPUT_TOKENS)
        body = plan.WORKLOADS[workload]
        if target in plan.MODEL_TARGETS:
            target, body = "L2", {**body, "model": plan.MODEL_TARGETS[target]}
        base = self.urls["bare"] + "/joined" if target == "bare-joined" else self.urls[target]
        unique = workload in plan.UNIQUE
        return http_worker_factory(base + "/v1", Workload("/completions", body, plan.OUTPUT_TOKENS, unique))


def _llama_settings() -> tuple[Path, dict[str, Any]]:
    config = load_config(CONFIG)
    model = next(m for m in config.models if m.name == plan.LLAMA_MODEL)
    assert model.source is not None
    return resolve_model_file(model.source), model.engine


def _llama_server_command(gguf: Path, n_ctx: int, variant: str = "portable") -> list[str]:
    """llama-server on the cores the batched Raygate target uses: its replicas' threads together
    (at most the machine's), for prefill and decode, with 8 slots of `n_ctx` tokens each."""
    config = load_config(CONFIG)
    model = next(m for m in config.models if m.name == plan.BATCHED_MODEL)
    threads = min(os.cpu_count() or 1, model.replicas * int(model.engine.get("n_threads", 1)))
    slots = plan.LLAMA_SERVER_SLOTS
    return [
        str(llama_server.binary(variant=variant)),
        "--model",
        str(gguf),
        "--alias",
        plan.LLAMA_MODEL,
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(n_ctx * slots),
        "--host",
        "127.0.0.1",
        "--port",
        servers.PORT,
        "--metrics",  # llamacpp:n_decode_total: bench/forward.py
    ]


@contextlib.contextmanager
def started_servers(needed: set[str], log_dir: Path) -> Iterator[Targets]:
    """Start what the scenarios need, all at once (loading overlaps), and stop them afterwards."""
    gguf, engine_kwargs = _llama_settings()
    threads = int(engine_kwargs.get("n_threads", 1))
    py = sys.executable
    commands = {
        "L1": [py, "-m", "bench.inproc_app", "--config", str(CONFIG), "--port", servers.PORT],
        "L2": [str(servers.BIN / "raygate"), "serve", "--config", str(CONFIG), "--port", servers.PORT],
        "peer": [
            py,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--model_alias",
            plan.LLAMA_MODEL,
            "--n_ctx",
            str(engine_kwargs.get("n_ctx", 2048)),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--interrupt_requests",
            "False",
            "--host",
            "127.0.0.1",
            "--port",
            servers.PORT,
        ],
        "bare": [py, "-m", "bench.bare_app", "--port", servers.PORT],
    }
    if SERVE in needed:
        argv = [str(servers.BIN / "raygate"), "serve", "--port", servers.PORT]
        commands[SERVE] = [*argv, "--config", str(_serve_config(log_dir))]
    if needed & plan.LLAMA_SERVERS.keys():
        n_ctx = int(engine_kwargs.get("n_ctx", 2048))
        commands.update(
            {
                name: [*_llama_server_command(gguf, n_ctx, variant), *flags]
                for name, (variant, flags) in plan.LLAMA_SERVERS.items()
            }
        )
    health = {
        "L1": "/health",
        "L2": "/health",
        "peer": "/v1/models",
        "bare": "/health",
        SERVE: "/ready",
        **dict.fromkeys(plan.LLAMA_SERVERS, "/health"),
    }
    # The gateway must start its own Ray, never attach to another session's cluster.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    targets = Targets(llama_threads=threads, log_dir=log_dir)
    try:
        for name in sorted(needed & commands.keys()):
            targets.procs[name] = servers.start(name, commands[name], log_dir / f"{name}.log", env=env)
        for name, server in targets.procs.items():
            servers.wait_healthy(server, health[name])
            targets.urls[name] = server.url
            log.info("%s ready on %s", name, server.url)
        if SERVE in targets.procs:
            targets.serving = SERVE  # started with models/default.yaml itself
            targets.urls.update(dict.fromkeys(plan.SOLO_TARGETS, targets.urls[SERVE]))
        yield targets
    finally:
        for name, server in targets.procs.items():
            code = server.stop()
            log.info("%s stopped (exit %s)", name, code)


async def _load_l0(targets: Targets) -> None:
    config = load_config(CONFIG)
    model = next(m for m in config.models if m.name == plan.LLAMA_MODEL)
    targets.engine = await load_engine(model, CONFIG.parent)


def _requests(scenario: plan.Scenario, level: int) -> int:
    return max(scenario.min_requests, scenario.requests_per_stream * level)


async def warm_up(scenario: plan.Scenario, targets: Targets) -> None:
    """Unmeasured requests first: llama.cpp's first request evaluates the whole prompt (later ones
    reuse the cached prefix), and connections, imports and allocators all settle. Two at once, so
    both engines of a two-replica target are warm."""
    for target in scenario.targets:
        if (target, scenario.workload) in targets.warm:
            continue
        targets.warm.add((target, scenario.workload))
        await run_closed_loop(
            targets.factory(target, scenario.workload), concurrency=2, requests=2, max_seconds=60
        )


def _serve_config(folder: Path) -> Path:
    """models/default.yaml, written to `folder` with relative model paths made absolute (they were
    relative to models/): what `make serve` starts, and the `serve` target."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for model in data["models"]:
        source = model.get("source") or {}
        if "path" in source and not Path(source["path"]).is_absolute():
            source["path"] = str(DEFAULT_CONFIG.parent / source["path"])
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def variant_spec(target: str) -> dict[str, Any]:
    """The chat model's spec in models/default.yaml with `target`'s changes (plan.SOLO_TARGETS;
    `engine:` keys merged into the model's own)."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    chat = next(m for m in data["models"] if m["name"] == plan.LLAMA_MODEL)
    changes = plan.SOLO_TARGETS[target]
    engine = changes.get("engine", {})
    assert isinstance(engine, dict)
    return {**chat, **changes, "engine": {**chat["engine"], **engine}}


SERVE = "serve"  # the gateway all plan.SOLO_TARGETS share, one shape at a time


async def use_variant(target: str, targets: Targets) -> None:
    """Reshape the `serve` gateway's chat model to `target` (an admin update: a fresh replica
    with the new spec), unless it has that shape already. Its replicas' RSS once up is recorded
    the first time, before any request reaches them."""
    if targets.serving == target:
        return
    spec = variant_spec(target)
    async with httpx.AsyncClient(base_url=targets.urls[SERVE], timeout=600) as http:
        await servers.update_deployment(http, plan.LLAMA_MODEL, spec)
    gateway = targets.procs[SERVE].proc.pid
    replicas = int(spec.get("replicas", 1))
    for _ in range(60):  # the replaced replicas are drained and killed after the update
        chat = [r for r in replica_rss(gateway) if r["model"] == "llama.cpp chat"]
        if len(chat) == replicas:
            break
        await asyncio.sleep(0.5)
    targets.rss.setdefault(target, {}).setdefault("replica_rss_at_start_mb", replica_rss(gateway))
    targets.serving = target
    targets.warm = {w for w in targets.warm if w[0] != target}  # a fresh replica: warm it again


async def run_scenario(scenario: plan.Scenario, targets: Targets) -> list[dict[str, Any]]:
    """Every target in interleaved rounds; a solo target (plan.SOLO_TARGETS) reshapes the `serve`
    gateway before each of its runs, so its shapes alternate with the others as well."""
    collected: dict[tuple[str, int], tuple[list[RequestResult], float]] = {}
    loads: dict[tuple[str, int], list[float]] = {}  # 1-minute load average: how shared the cores were
    shared = tuple(t for t in scenario.targets if t not in plan.SOLO_TARGETS)
    await warm_up(replace(scenario, targets=shared), targets)
    await _run_levels(scenario, scenario.targets, targets, collected, loads)
    # Memory after the runs, for every target that is one serving process or a gateway's shape
    # (once up: `use_variant`, and llama-server's at its start).
    if "llama-server" in shared:
        pid = targets.procs["llama-server"].proc.pid
        targets.rss["llama-server"] = {"rss_after_runs_mb": servers.rss_mb(pid)}
    passes = {(t, c): v for (name, t, c), v in targets.forward.items() if name == scenario.name}
    return [
        {
            "target": t,
            "concurrency": c,
            "loadavg": sum(loads[(t, c)]) / len(loads[(t, c)]),
            "summary": summarize(res, wall).to_dict(),
            **targets.rss.get(t, {}),
            **({"forward": forward.summary(passes[(t, c)], wall)} if (t, c) in passes else {}),
        }
        for (t, c), (res, wall) in collected.items()
    ]


async def _run_levels(
    scenario: plan.Scenario,
    names: tuple[str, ...],
    targets: Targets,
    collected: dict[tuple[str, int], tuple[list[RequestResult], float]],
    loads: dict[tuple[str, int], list[float]],
) -> None:
    for level in scenario.levels:
        for r in range(scenario.rounds):
            order = names if r % 2 == 0 else tuple(reversed(names))
            for target in order:
                if target in plan.SOLO_TARGETS:
                    await use_variant(target, targets)
                    await warm_up(replace(scenario, targets=(target,)), targets)
                url = targets.urls.get(target, "")
                counted = bool(url) and targets.counts_passes(target)
                before = await forward.read(url, plan.LLAMA_MODEL) if counted else {}
                results, wall = await run_closed_loop(
                    targets.factory(target, scenario.workload),
                    concurrency=level,
                    requests=_requests(scenario, level),
                    max_seconds=scenario.max_seconds,
                )
                if counted:
                    after = await forward.read(url, plan.LLAMA_MODEL)
                    forward.add(targets.forward.setdefault((scenario.name, target, level), {}), before, after)
                done, total = collected.get((target, level), ([], 0.0))
                collected[(target, level)] = (done + results, total + wall)
                loads.setdefault((target, level), []).append(os.getloadavg()[0])
                if target in plan.SOLO_TARGETS:
                    gateway = targets.procs[SERVE].proc.pid
                    targets.rss[target]["replica_rss_mb"] = replica_rss(gateway)
                ok = sum(x.ok for x in results)
                log.info(
                    "%s %s c=%d round %d: %d/%d ok in %.1fs",
                    scenario.name,
                    target,
                    level,
                    r,
                    ok,
                    len(results),
                    wall,
                )


async def run_memory(targets: Targets, requests: int, every: int) -> dict[str, Any]:
    """Gateway and replica RSS across many instant-engine requests; the slope says if it grows."""
    gateway = targets.procs["L2"].proc.pid
    factory = targets.factory("L2", "instant")
    samples: list[dict[str, Any]] = []

    def sample(done: int) -> None:
        samples.append(
            {
                "requests": done,
                "gateway_mb": servers.rss_mb(gateway),
                "replicas": replica_rss(gateway),
            }
        )

    sample(0)
    failures = 0
    for done in range(every, requests + 1, every):
        results, _ = await run_closed_loop(
            factory, concurrency=plan.MEMORY_CONCURRENCY, requests=every, max_seconds=120
        )
        failures += sum(not r.ok for r in results)
        sample(done)
    return {
        "requests": requests,
        "concurrency": plan.MEMORY_CONCURRENCY,
        "failures": failures,
        "samples": samples,
    }


def replica_rss(gateway: int) -> list[dict[str, Any]]:
    gguf, _ = _llama_settings()
    return [
        {
            "pid": p,
            "model": "llama.cpp chat" if servers.maps_file(p, gguf) else "other",
            "rss_mb": servers.rss_mb(p),
        }
        for p in servers.replica_pids(gateway)
    ]


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


async def run_plan(
    scenarios: tuple[plan.Scenario, ...],
    log_dir: Path,
    memory_requests: int,
    with_rerank: bool = False,
    batch_row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`batch_row`: run bench/batches.py's row with these arguments (`lines`, `seconds`)."""
    needed = {SERVE if t in plan.SOLO_TARGETS else t for s in scenarios for t in s.targets}
    needed |= {"L2"} if memory_requests or with_rerank or batch_row is not None else set()
    if "bare-joined" in needed:
        needed.add("bare")
    if needed & plan.MODEL_TARGETS.keys():
        needed.add("L2")
    started = time.time()
    record: dict[str, Any] = {"started": started, "machine_before": machine(), "scenarios": {}}
    with started_servers(needed, log_dir) as targets:
        if "L0" in needed:
            await _load_l0(targets)
        for name, server in targets.procs.items():
            record.setdefault("rss_after_start_mb", {})[name] = servers.rss_mb(server.proc.pid)
        if "L2" in targets.procs:
            record["replica_rss_after_start_mb"] = replica_rss(targets.procs["L2"].proc.pid)
        if SERVE in targets.procs:
            targets.rss[SERVE] = {"replica_rss_at_start_mb": replica_rss(targets.procs[SERVE].proc.pid)}
        for scenario in scenarios:
            record["scenarios"][scenario.name] = {
                "workload": plan.WORKLOADS[scenario.workload],
                "runs": await run_scenario(scenario, targets),
            }
        if "L2" in targets.procs:
            record["replica_rss_mb"] = replica_rss(targets.procs["L2"].proc.pid)
        if memory_requests:
            record["memory"] = await run_memory(targets, memory_requests, plan.MEMORY_SAMPLE_EVERY)
        if with_rerank:
            record["rerank"] = await asyncio.to_thread(rerank.measure, targets.urls["L2"])
        if batch_row is not None:
            record["batches"] = await batches.measure(targets.urls["L2"], **batch_row)
    record["machine_after"] = machine()
    record["duration_s"] = time.time() - started
    return record


def run(
    scenarios: tuple[plan.Scenario, ...],
    log_dir: Path,
    memory_requests: int,
    with_rerank: bool = False,
    batch_row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The client runs on uvloop, like the servers, so its own per-frame cost stays small."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_plan(scenarios, log_dir, memory_requests, with_rerank, batch_row))
