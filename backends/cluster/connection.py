"""Joining or starting the Ray cluster the replicas run on."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from backends.cluster import embedded

NAMESPACE = "raygate"


def connect(address: str | None, num_cpus: float | None = None, namespace: str = NAMESPACE) -> None:
    """Attach to `address` (an existing cluster), or start an embedded single-node Ray.

    The embedded cluster is private to this process, so Ray's token auth is turned off for it; an
    existing cluster keeps whatever auth mode its operator chose. The namespace scopes the named
    actors (controller, replicas): gateways in the same namespace share them.
    """
    if ray.is_initialized():
        return
    with _keep_signal_handlers():
        if address:
            ray.init(address=address, namespace=namespace, log_to_driver=True)
            return
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # Ray starts worker processes at nice 15. Replicas are the workload here, not background
        # jobs: niced, a replica got a few percent of a shared core against any normal process
        # and its TTFT went from ~20 ms to 30-600 ms (measured with bench/ on 2 busy cores).
        os.environ.setdefault("RAY_worker_niceness", "0")
        # What a gateway that was killed left behind goes first; this one's is watched (embedded.py).
        embedded.reap_stale()
        context = ray.init(
            namespace=namespace,
            include_dashboard=False,
            num_cpus=num_cpus,  # type: ignore[arg-type]  # Ray types it int; it takes a float
            log_to_driver=True,
        )
        embedded.guard(context.address_info["session_dir"])  # type: ignore[attr-defined]


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


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()
