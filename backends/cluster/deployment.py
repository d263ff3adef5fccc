"""One deployment inside the controller: its spec and the life of each of its replica actors.

A replica goes loading -> ready, and is then watched with a call that never returns
(`ModelWorker.watch`): Ray fails that call the moment the actor or its node dies, so deaths are
noticed without polling. A dead replica is replaced while the deployment has restarts left and some
alive node can host it; otherwise it stays listed as `failed` with the reason.

The restart budget is a rate, not a lifetime count: at most `max_restarts` replacements within
`RESTART_WINDOW_SECONDS`. A lifetime count let a few isolated crashes (one poison request each,
issue #12) leave a model `failed` for good; now a replica refused for the budget is tried again
once the oldest restart has left the window, so a crash loop is slowed, never made permanent.

Replicas that are removed on purpose (scale down, update, undeploy) are drained first: out of
routing, new requests turned away to other replicas, running ones finished (bounded by a timeout),
then killed.

Everything here runs on the controller's event loop, so plain attributes need no locks; code after
an `await` re-checks what may have changed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray
from ray.exceptions import RayActorError, RayTaskError

from backends.cluster.placement import check_feasible
from backends.cluster.replica import ModelWorker
from backends.cluster.route_table import DeploymentRoute, ReplicaRoute
from protocol.admin import DeploymentState, DeploymentStatus, ReplicaState, ReplicaStatus
from protocol.config import ModelConfig

log = logging.getLogger(__name__)

LOAD_TIMEOUT_SECONDS = 900.0
PLACEMENT_CHECK_SECONDS = 2.0
UPDATE_POLL_SECONDS = 0.2
UPDATE_DRAIN_SECONDS = 60.0
# `max_restarts` counts replacements within this many seconds (module docstring).
RESTART_WINDOW_SECONDS = 600.0
# The restart window's clock (a name of its own, so tests can move it without moving asyncio's).
restart_clock: Callable[[], float] = time.monotonic
MAX_REASON_CHARS = 600
# Lines of Ray's actor-death message that identify the actor rather than say what happened.
_RAY_ID_LINE = re.compile(r"^\s*(class_name|actor_id|pid|name|namespace|ip):")

OnChange = Callable[[bool], None]  # called with spec_changed=True when the spec must be persisted


class UnplaceableError(RuntimeError):
    """No alive node can host the replica any more."""


class ReplicaActors(Protocol):
    """How a deployment starts, kills and places its replica actors. `RayActors` in the controller;
    tests pass a fake, so the state machine runs without a cluster."""

    def start(self, spec: ModelConfig, seq: int) -> Any: ...

    def kill(self, actor: Any) -> None: ...

    async def check_feasible(self, spec: ModelConfig) -> str | None: ...


class RayActors:
    """`ReplicaActors` on Ray: one `ModelWorker` actor per replica."""

    def start(self, spec: ModelConfig, seq: int) -> Any:
        return (
            ray.remote(ModelWorker)
            .options(
                name=f"raygate:{spec.name}:{seq}:{uuid.uuid4().hex[:8]}",
                num_cpus=spec.num_cpus,
                num_gpus=spec.num_gpus,
                resources=spec.resources or None,
                runtime_env={"env_vars": spec.env} if spec.env else None,
            )
            .remote(spec)
        )

    def kill(self, actor: Any) -> None:
        ray.kill(actor)

    async def check_feasible(self, spec: ModelConfig) -> str | None:
        return await check_feasible(spec)


def describe_failure(exc: BaseException) -> str:
    """One line saying why a replica failed: the engine's own error, or Ray's death reason."""
    if isinstance(exc, RayTaskError) and exc.cause is not None:
        cause = exc.cause
        return f"{type(cause).__name__}: {cause}"[:MAX_REASON_CHARS]
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not _RAY_ID_LINE.match(ln)]
    return " ".join(lines)[:MAX_REASON_CHARS] or type(exc).__name__


@dataclass(eq=False)
class ReplicaRecord:
    """The controller's record of one replica actor. `generation` ties it to a spec, so a rolling update tells
    old replicas from new; `stopping` marks one being drained."""

    id: str
    seq: int
    actor: Any
    generation: int
    state: ReplicaState = "loading"
    since: float = field(default_factory=time.time)
    node_id: str | None = None
    error: str | None = None
    context_length: int = 0
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    stopping: bool = False
    task: asyncio.Task[None] | None = None


class Deployment:
    """One model inside the controller: keeps as many replicas as its spec asks for, replaces dead ones within
    `max_restarts`, and runs scale, update and undeploy."""

    def __init__(self, spec: ModelConfig, on_change: OnChange, actors: ReplicaActors | None = None) -> None:
        self.spec = spec
        self._actors: ReplicaActors = actors or RayActors()
        self.replicas: list[ReplicaRecord] = []
        self.restarts = 0  # replacements within the restart window (module docstring)
        self._restarted_at: deque[float] = deque()  # their monotonic times, oldest first
        self.error: str | None = None
        self.updating = False
        self._generation = 0
        self._seq = itertools.count(1)
        self._on_change = on_change
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- what the controller reads -------------------------------------------------------------

    def count(self, state: ReplicaState) -> int:
        return sum(1 for r in self.replicas if r.state == state)

    @property
    def state(self) -> DeploymentState:
        ready = self.count("ready")
        if ready >= self.spec.replicas:
            return "ready"
        if self.count("loading"):
            return "loading"
        return "degraded" if ready else "failed"

    def status(self) -> DeploymentStatus:
        return DeploymentStatus(
            name=self.spec.name,
            state=self.state,
            error=self.error,
            ready=self.count("ready"),
            desired=self.spec.replicas,
            restarts=self.restarts,
            updating=self.updating,
            spec=self.spec,
            replicas=[
                ReplicaStatus(id=r.id, state=r.state, node_id=r.node_id, error=r.error, since=r.since)
                for r in self.replicas
            ],
        )

    def route(self) -> DeploymentRoute:
        ready = [
            ReplicaRoute(r.id, r.actor, r.node_id or "", r.context_length, r.generation_defaults)
            for r in self.replicas
            if r.state == "ready"
        ]
        return DeploymentRoute(self.spec, self.state, self.error, ready, self.restarts)

    # ---- operations ----------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Start replicas until the current spec has as many loading or ready ones as it asks for."""
        if self._closed:
            return
        live = [r for r in self._current() if r.state in ("loading", "ready")]
        for _ in range(self.spec.replicas - len(live)):
            self._start_replica(self.spec, self._generation)

    def scale(self, replicas: int, drain_timeout: float) -> None:
        """Change the replica count. Removed replicas drain; the ones that stay are not touched."""
        self.spec = self.spec.model_copy(update={"replicas": replicas})
        self._reset_restarts()
        self._forget_failed()
        live = [r for r in self._current() if r.state in ("loading", "ready")]
        # Remove what serves nobody yet first (loading), then the newest ready replicas.
        victims = sorted(live, key=lambda r: (r.state == "ready", -r.seq))[: max(0, len(live) - replicas)]
        for rec in victims:
            self._stop_soon(rec, drain_timeout)
        self.reconcile()
        self._on_change(True)

    def update(self, spec: ModelConfig) -> None:
        """Apply a new spec. Only aliases / replicas / max_restarts changed: in place. Anything else
        (weights, engine, resources...): start a full new set, then drain the old one once every new
        replica is ready; if any fails, drop the new set and keep serving the old spec."""
        light = {"aliases", "replicas", "max_restarts"}
        if self.spec.model_dump(exclude=light) == spec.model_dump(exclude=light):
            replicas = spec.replicas
            self.spec = spec.model_copy(update={"replicas": self.spec.replicas})
            if replicas != self.spec.replicas:
                self.scale(replicas, UPDATE_DRAIN_SECONDS)
            else:
                self._on_change(True)
            return
        self.updating = True
        self._forget_failed()
        self._spawn(self._roll(spec, self._generation + 1))
        self._on_change(False)

    async def undeploy(self, timeout: float) -> bool:
        """Drain and stop every replica; True if no in-flight request had to be cut."""
        self._closed = True
        for rec in self.replicas:
            self._begin_stop(rec)
        results = await asyncio.gather(*(self._stop(r, timeout) for r in list(self.replicas)))
        for task in list(self._tasks):
            task.cancel()
        return all(results)

    # ---- internals -----------------------------------------------------------------------------

    def _current(self) -> list[ReplicaRecord]:
        """Replicas of the serving spec that are not on their way out."""
        return [r for r in self.replicas if r.generation == self._generation and not r.stopping]

    def _forget_failed(self) -> None:
        self.replicas = [r for r in self.replicas if r.state != "failed"]

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task

    def _set(self, rec: ReplicaRecord, state: ReplicaState) -> None:
        rec.state, rec.since = state, time.time()
        self._on_change(False)

    def _start_replica(self, spec: ModelConfig, generation: int) -> ReplicaRecord:
        seq = next(self._seq)
        actor = self._actors.start(spec, seq)
        rec = ReplicaRecord(id=f"{spec.name}#{seq}", seq=seq, actor=actor, generation=generation)
        self.replicas.append(rec)
        rec.task = self._spawn(self._run(rec, spec))
        self._on_change(False)
        return rec

    async def _run(self, rec: ReplicaRecord, spec: ModelConfig) -> None:
        t0 = time.monotonic()
        try:
            info = await self._load(rec, spec)
        except RayActorError as exc:  # the process or its node died while loading
            if not rec.stopping:
                await self._on_death(rec, exc)
            return
        except Exception as exc:  # the engine could not load: retrying would fail the same way
            if not rec.stopping:
                self._fail(rec, f"could not load: {describe_failure(exc)}")
            return
        if rec.stopping:
            return
        rec.node_id, rec.context_length = str(info["node_id"]), int(info["context_length"])
        rec.generation_defaults = dict(info.get("generation_defaults") or {})
        log.info("replica %s ready on node %s in %.1fs", rec.id, rec.node_id[:12], time.monotonic() - t0)
        self._set(rec, "ready")
        try:
            await rec.actor.watch.remote()
        except Exception as exc:
            if not rec.stopping:
                await self._on_death(rec, exc)

    async def _load(self, rec: ReplicaRecord, spec: ModelConfig) -> dict[str, Any]:
        """Wait for `start()`, checking now and then that the replica can still be placed at all
        (a replica waiting for a node that died would otherwise show `loading` forever)."""
        started = asyncio.ensure_future(rec.actor.start.remote())
        deadline = time.monotonic() + LOAD_TIMEOUT_SECONDS
        try:
            while True:
                done, _ = await asyncio.wait([started], timeout=PLACEMENT_CHECK_SECONDS)
                if done:
                    result: dict[str, Any] = started.result()
                    return result
                why = await self._actors.check_feasible(spec)
                if why is not None:
                    raise UnplaceableError(f"cannot be placed: {why}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready after {LOAD_TIMEOUT_SECONDS:.0f}s")
        finally:
            started.cancel()

    def _fail(self, rec: ReplicaRecord, reason: str) -> None:
        rec.error = reason[:MAX_REASON_CHARS]
        self.error = f"replica {rec.id} {rec.error}"
        log.error("deployment %s: %s", self.spec.name, self.error)
        with contextlib.suppress(Exception):
            self._actors.kill(rec.actor)  # frees its resources (a no-op if it is already dead)
        self._set(rec, "failed")

    async def _on_death(self, rec: ReplicaRecord, exc: BaseException) -> None:
        self._fail(rec, f"died: {describe_failure(exc)}")
        if self._closed or rec.generation != self._generation:
            return  # being removed, or part of an update that will notice the failure
        await self._replace(rec, rec.error or "died")

    async def _replace(self, rec: ReplicaRecord, death: str) -> None:
        """Start a replacement for the dead `rec` if the budget and the cluster allow; if only the
        budget refuses, try again when it allows (`_replace_later`)."""
        limit = self.spec.max_restarts
        wait = self._restart_wait(limit)
        why = None if wait is None else f"max_restarts={limit} reached within {RESTART_WINDOW_SECONDS:g}s"
        if why is None:
            why = await self._actors.check_feasible(self.spec)
        if self._closed or rec not in self.replicas:
            return
        if why is not None:
            if wait is not None and wait != float("inf"):
                why = f"{why}; next try in {wait:.0f}s"
                self._spawn(self._replace_later(rec, death, wait))
            rec.error = f"{death}; not replaced: {why}"[:MAX_REASON_CHARS]
            self.error = f"replica {rec.id} {rec.error}"
            self._on_change(False)
            return
        self._restarted_at.append(restart_clock())
        self.restarts = len(self._restarted_at)
        self.replicas.remove(rec)
        self.error = (
            f"replica {rec.id} {death}; replaced ({self.restarts}/{limit} restarts used "
            f"within {RESTART_WINDOW_SECONDS:g}s)"
        )
        log.warning("deployment %s: %s", self.spec.name, self.error)
        self._start_replica(self.spec, self._generation)

    def _restart_wait(self, limit: int) -> float | None:
        """None if a restart is within the budget now; else seconds until one is (inf: never,
        `max_restarts: 0`). Forgets restarts older than the window."""
        now = restart_clock()
        while self._restarted_at and now - self._restarted_at[0] >= RESTART_WINDOW_SECONDS:
            self._restarted_at.popleft()
        self.restarts = len(self._restarted_at)
        if self.restarts < limit:
            return None
        if not self._restarted_at:
            return float("inf")
        return max(0.0, self._restarted_at[-limit] + RESTART_WINDOW_SECONDS - now)

    async def _replace_later(self, rec: ReplicaRecord, death: str, wait: float) -> None:
        await asyncio.sleep(wait)
        if self._closed or rec not in self.replicas or rec.state != "failed" or rec.stopping:
            return
        if rec.generation != self._generation:
            return
        await self._replace(rec, death)

    def _reset_restarts(self) -> None:
        self.restarts = 0
        self._restarted_at.clear()

    def _stop_soon(self, rec: ReplicaRecord, timeout: float) -> None:
        """Take `rec` out of routing now (so the status returned to the caller already says
        `draining`) and finish stopping it in the background."""
        self._begin_stop(rec)
        self._spawn(self._stop(rec, timeout))

    def _begin_stop(self, rec: ReplicaRecord) -> None:
        if rec.stopping:
            return
        rec.stopping = True
        if rec.state == "ready":
            self._set(rec, "draining")  # gateways drop it from routing on this change

    async def _stop(self, rec: ReplicaRecord, timeout: float) -> bool:
        """Drain (if it was serving) and kill one replica. True if nothing in flight had to be cut."""
        self._begin_stop(rec)
        drained = True
        if rec.state == "draining":
            try:
                drained = bool(await asyncio.wait_for(rec.actor.drain.remote(timeout), timeout + 10))
            except Exception:
                drained = False  # already dead, or stuck
        if rec.task is not None:
            rec.task.cancel()
        with contextlib.suppress(Exception):
            self._actors.kill(rec.actor)
        if rec in self.replicas:
            self.replicas.remove(rec)
        self._on_change(False)
        return drained

    async def _roll(self, spec: ModelConfig, generation: int) -> None:
        fresh = [self._start_replica(spec, generation) for _ in range(spec.replicas)]
        # A poll, not an event: replica tasks set states; polling keeps them unaware of updates.
        while not self._closed and any(r.state == "loading" for r in fresh):  # noqa: ASYNC110
            await asyncio.sleep(UPDATE_POLL_SECONDS)
        if self._closed:
            return
        broken = [r for r in fresh if r.state != "ready"]
        if broken:
            self.error = (
                f"update failed, still serving the previous spec: replica {broken[0].id} {broken[0].error}"
            )
            await asyncio.gather(*(self._stop(r, UPDATE_DRAIN_SECONDS) for r in fresh))
            self.updating = False
            self._on_change(False)
            return
        old = [r for r in self.replicas if r.generation != generation]
        for rec in old:
            self._begin_stop(rec)
        self.spec, self._generation = spec, generation
        self.error, self.updating = None, False
        self._reset_restarts()
        self._on_change(True)
        await asyncio.gather(*(self._stop(r, UPDATE_DRAIN_SECONDS) for r in old))
