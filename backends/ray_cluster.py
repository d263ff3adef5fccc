"""Joining or starting the Ray cluster the replicas run on."""

from __future__ import annotations

import os

import ray

NAMESPACE = "raygate"


def connect(address: str | None, num_cpus: float | None = None) -> None:
    """Attach to `address` (an existing cluster), or start an embedded single-node Ray.

    The embedded cluster is private to this process, so Ray's token auth is turned off for it; an
    existing cluster keeps whatever auth mode its operator chose.
    """
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        namespace=NAMESPACE,
        include_dashboard=False,
        num_cpus=int(num_cpus) if num_cpus else None,
        log_to_driver=True,
    )


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()
