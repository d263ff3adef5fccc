"""The seam between a deployment and the Ray actors that host its replicas.

`Deployment` (deployment.py, its replicas in replica_set.py) is a state machine; starting, killing
and placing actors is the only part of it that needs a live cluster. That part sits behind
`ReplicaActors`, which `RayActors` implements on Ray and the unit tests implement with fakes, so the
state machine runs without a cluster. `wait_started` (a replica's load, with placement checks) and
`describe_failure` (Ray's errors as one line) are here for the same reason: the state machine only
ever sees a load's result or a one-line reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Callable, Set
from typing import Any, Protocol

import ray
from ray.exceptions import RayTaskError

from raygate.backends.cluster.routing.replica import ModelWorker
from raygate.backends.cluster.runtime.placement import check_feasible, replica_preference
from raygate.protocol.config import ModelConfig

LOAD_TIMEOUT_SECONDS = 900.0
PLACEMENT_CHECK_SECONDS = 2.0
PROGRESS_POLL_SECONDS = 0.5
MAX_REASON_CHARS = 600
# Lines of Ray's actor-death message that identify the actor rather than say what happened.
_RAY_ID_LINE = re.compile(r"^\s*(class_name|actor_id|pid|name|namespace|ip):")


class UnplaceableError(RuntimeError):
    """No alive node can host the replica any more."""


class ReplicaActors(Protocol):
    """How a deployment starts, kills and places its replica actors. `RayActors` in the controller;
    tests pass a fake, so the state machine runs without a cluster."""

    def start(self, spec: ModelConfig, seq: int) -> Any: ...

    def kill(self, actor: Any) -> None: ...

    async def check_feasible(self, spec: ModelConfig) -> str | None: ...


class RayActors:
    """`ReplicaActors` on Ray: one `ModelWorker` actor per replica. `reserved` returns the custom
    resources the other deployments request: a replica that asks for none prefers a node that
    offers none of them (placement.replica_preference), so it does not take their only room."""

    def __init__(self, reserved: Callable[[str], Set[str]] | None = None) -> None:
        self._reserved = reserved

    def start(self, spec: ModelConfig, seq: int) -> Any:
        reserved = set(self._reserved(spec.name)) if self._reserved is not None else set()
        return (
            ray.remote(ModelWorker)
            .options(
                name=f"raygate:{spec.name}:{seq}:{uuid.uuid4().hex[:8]}",
                num_cpus=spec.num_cpus,
                num_gpus=spec.num_gpus,
                resources=spec.resources or None,
                runtime_env={"env_vars": spec.env} if spec.env else None,
                **replica_preference(spec, reserved),
            )
            .remote(spec)
        )

    def kill(self, actor: Any) -> None:
        ray.kill(actor)

    async def check_feasible(self, spec: ModelConfig) -> str | None:
        return await check_feasible(spec)


async def wait_started(
    actors: ReplicaActors,
    actor: Any,
    spec: ModelConfig,
    on_progress: Callable[[dict[str, Any] | None], None] | None = None,
) -> dict[str, Any]:
    """Wait for `start()`, checking now and then that the replica can still be placed at all
    (a replica waiting for a node that died would otherwise show `loading` forever), and, for a
    Hub source, reading its download's progress for `on_progress`. The load timeout counts from
    the end of the download: a big model on a slow link is not a stuck load."""
    started = asyncio.ensure_future(actor.start.remote())
    deadline = time.monotonic() + LOAD_TIMEOUT_SECONDS
    next_check = time.monotonic() + PLACEMENT_CHECK_SECONDS
    poll = PROGRESS_POLL_SECONDS if on_progress is not None else PLACEMENT_CHECK_SECONDS
    try:
        while True:
            done, _ = await asyncio.wait([started], timeout=poll)
            if done:
                result: dict[str, Any] = started.result()
                return result
            if on_progress is not None:
                with contextlib.suppress(Exception):  # not scheduled yet, or busy: next time
                    progress = await asyncio.wait_for(actor.progress.remote(), PLACEMENT_CHECK_SECONDS)
                    on_progress(progress)
                    if progress is not None and not progress.get("done"):
                        deadline = time.monotonic() + LOAD_TIMEOUT_SECONDS
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + PLACEMENT_CHECK_SECONDS
            why = await actors.check_feasible(spec)
            if why is not None:
                raise UnplaceableError(f"cannot be placed: {why}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {LOAD_TIMEOUT_SECONDS:.0f}s")
    finally:
        started.cancel()


def describe_failure(exc: BaseException) -> str:
    """One line saying why a replica failed: the engine's own error, or Ray's death reason."""
    if isinstance(exc, RayTaskError) and exc.cause is not None:
        cause = exc.cause
        return f"{type(cause).__name__}: {cause}"[:MAX_REASON_CHARS]
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not _RAY_ID_LINE.match(ln)]
    return " ".join(lines)[:MAX_REASON_CHARS] or type(exc).__name__
