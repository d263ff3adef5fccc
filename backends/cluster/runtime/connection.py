"""Joining or starting the Ray cluster the replicas run on."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import ray

from raygate.backends.cluster.runtime import agents as raylet_agents
from raygate.backends.cluster.runtime import embedded
from raygate.backends.cluster.runtime.worker_logs import WorkerLogs

NAMESPACE = "raygate"
logger = logging.getLogger(__name__)
_worker_logs: list[WorkerLogs] = []  # the embedded cluster's follower, while connected
# Ray 2.60's raylet gives its dashboard agent (a Python process that imports much of Ray) a fixed
# 15 s to write its port files and aborts when it is late: on a busy box `ray.init` then fails
# with "timed out during startup" (seen dozens of times beside stress-ng here). Neither
# RAY_agent_register_timeout_ms nor explicit agent ports lift that wait; a fresh start does (at a
# load of ~11 on two cores, two starts in a row failed that way).
START_ATTEMPTS = 5
# What a start that failed that way says. The second: under a load of ~35 on two cores a starved
# GCS did not answer `ray start`'s first call within its deadline ("Failed to connect to GCS").
START_FAILURES = ("timed out during startup", "Failed to connect to GCS")
# A cluster started here is private to its process: Ray's token auth off. Ray starts worker
# processes at nice 15; replicas are the workload here, not background jobs: niced, a replica got
# a few percent of a shared core against any normal process and its TTFT went from ~20 ms to
# 30-600 ms (measured with bench/ on 2 busy cores); the image and compose set the niceness too.
# A worker (a Python start that imports Ray) not registered within Ray's 60 s is killed and started
# again: at a load of ~40 on two cores starts took longer than that, and each retry added to the
# load (up to 118) until gateways timed out; 300 s lets a slow start finish.
LOCAL_RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_worker_niceness": "0",
    "RAY_worker_register_timeout_seconds": "300",
}


def connect(
    address: str | None,
    num_cpus: float | None = None,
    namespace: str = NAMESPACE,
    dashboard: bool = False,
    agents: bool = False,
) -> None:
    """Attach to `address` (an existing cluster), or start an embedded single-node Ray.

    The embedded cluster is private to this process, so Ray's token auth is turned off for it; an
    existing cluster keeps whatever auth mode its operator chose. The namespace scopes the named
    actors (controller, replicas): gateways in the same namespace share them. `dashboard`: the
    embedded cluster keeps all of Ray's processes; `agents`: its raylet runs Ray's own agents
    (`start_local`).
    """
    if ray.is_initialized():
        return
    with _keep_signal_handlers():
        if address:
            ray.init(address=address, namespace=namespace, log_to_driver=True)
            return
        # What a gateway that was killed left behind goes first; this one's is watched (embedded.py).
        embedded.reap_stale()
        # The replicas' output reaches the gateway's log through Ray's log monitor with the
        # dashboard, else through a thread of this process (worker_logs.py, ~80 MB less).
        context = start_local(
            dashboard=dashboard,
            agents=agents,
            namespace=namespace,
            num_cpus=num_cpus,
            log_to_driver=dashboard,
        )
        session_dir = context.address_info["session_dir"]
        embedded.guard(session_dir)
        if not dashboard:
            _worker_logs.append(WorkerLogs(Path(session_dir) / "logs"))
            _worker_logs[-1].start()


def start_local(*, dashboard: bool = False, agents: bool = False, **init_args: Any) -> Any:
    """`ray.init` of a new single-node cluster, started again (up to START_ATTEMPTS times) when
    its raylet died during the start; returns Ray's context. LOCAL_RAY_ENV applies unless the
    environment says otherwise. Without `dashboard`, only what Raygate uses keeps running
    (`_stop_unused`)."""
    for name, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(name, value)
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            # `local`: a new cluster even where another one runs on this host (`ray start`);
            # without it `ray.init` attaches to the latest of those, someone else's.
            with raylet_agents.standing_in() if not (dashboard or agents) else contextlib.nullcontext():
                context = ray.init(address="local", include_dashboard=dashboard, **init_args)
        except Exception as exc:
            if attempt == START_ATTEMPTS or not is_start_failure(str(exc)):
                raise
            logger.warning(
                "Ray's start failed (attempt %d of %d), starting it again: %s", attempt, START_ATTEMPTS, exc
            )
            _kill_half_started_node(exc)
            ray.shutdown()
        else:
            if not dashboard:
                _stop_unused(log_to_driver=init_args.get("log_to_driver", True))
            return context
    raise AssertionError("unreachable")


def _stop_unused(log_to_driver: bool) -> None:
    """Stop the head node's processes that Raygate never calls on, once they are up (`ray.init`
    has no switch for them; Ray's own `Node.kill_*` keep its bookkeeping right): ~190 MB of RSS
    idle (Ray 2.60, measured by bench/footprint.py). The API server: with `include_dashboard=False`
    it loads only Ray's usage-stats module, and `ray.util.state`, `ray status` and the job API,
    which need it, are not used. The autoscaler monitor: it adds and removes *nodes* from a cluster
    config, which an embedded single node has none of (Raygate's replica autoscaling is its own
    controller's). The log monitor only when nothing reads what it forwards (`log_to_driver`):
    `raygate serve` reads the replicas' output itself (`worker_logs.py`). The raylet's two
    agents cannot be stopped (the raylet exits when either does): `agents.py` replaces them at
    the start."""
    node = ray._private.worker._global_node
    if node is None:
        return
    # The API server starts its modules through a forkserver: its descendants go with it.
    modules = _descendants(node.all_processes.get("dashboard", []))
    node.kill_dashboard(check_alive=False)
    for process in modules:
        with contextlib.suppress(psutil.Error):
            process.kill()
    node.kill_monitor(check_alive=False)
    if not log_to_driver:
        node.kill_log_monitor(check_alive=False)


def is_start_failure(message: str) -> bool:
    """`message` (an exception's, or `ray start`'s output) says Ray failed to come up in time."""
    return any(failure in message for failure in START_FAILURES)


def _kill_half_started_node(exc: BaseException) -> None:
    """A node whose start timed out is referenced only by the traceback, yet its processes run:
    kill and reap them now, or they outlive the attempt (and their `Popen` objects warn)."""
    from ray._private.node import Node

    tb = exc.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("self")
        if isinstance(node, Node):
            node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        tb = tb.tb_next


@contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """`ray.init` installs a SIGTERM handler that calls `sys.exit`, which would cut the HTTP
    server's graceful shutdown (and its exit code) short; the server's own handlers stay."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _descendants(infos: list[Any]) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for info in infos:
        with contextlib.suppress(psutil.Error):
            found += psutil.Process(info.process.pid).children(recursive=True)
    return found


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()
    while _worker_logs:  # after the shutdown: the replicas' last words are printed
        _worker_logs.pop().stop()
