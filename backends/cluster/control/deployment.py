"""One deployment inside the controller: its spec, how many replicas it aims at, and what happens
when one dies; the replicas themselves are started, watched and drained by its `ReplicaSet`
(replica_set.py).

A dead replica is replaced while the deployment has restarts left and some alive node can host it;
otherwise it stays listed as `failed` with the reason. The restarts left are a rate
(restart_budget.py); a replica refused for the budget is tried again once it allows.

The replica count aimed at is `target`: the spec's `replicas`, or with `autoscaling` the count the
controller's autoscaler last chose (`resize`), which may be zero. Every change of it is kept as a
`ScalingEvent` (the latest `MAX_EVENTS`), for `/admin`, `raygate list` and `/metrics`.

Everything here runs on the controller's event loop, so plain attributes need no locks; code after
an `await` re-checks what may have changed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from raygate.backends.cluster.control.autoscaler import Autoscaler, initial_target, target_for
from raygate.backends.cluster.control.replica_actors import (
    MAX_REASON_CHARS,
    RayActors,
    ReplicaActors,
    describe_failure,
)
from raygate.backends.cluster.control.replica_set import OnChange, ReplicaRecord, ReplicaSet
from raygate.backends.cluster.control.restart_budget import RestartBudget
from raygate.backends.cluster.routing.route_table import DeploymentRoute, ReplicaRoute
from raygate.protocol.admin import (
    DeploymentState,
    DeploymentStatus,
    DownloadProgress,
    ReplicaState,
    ReplicaStatus,
    ScalingEvent,
)
from raygate.protocol.config import ModelConfig
from raygate.protocol.lora import AdapterConfig

log = logging.getLogger(__name__)

UPDATE_POLL_SECONDS = 0.2
# A dead replica that no alive node can host (its node died, with the resources only it offered) is
# looked at again this often: a node that comes back, or a new one, gets it (found by `make chaos`).
NO_ROOM_RETRY_SECONDS = 5.0
UPDATE_DRAIN_SECONDS = 60.0
MAX_EVENTS = 20


class Deployment:
    """One model inside the controller: keeps as many replicas as its spec asks for, replaces dead ones within
    `max_restarts`, and runs scale, update and undeploy."""

    def __init__(self, spec: ModelConfig, on_change: OnChange, actors: ReplicaActors | None = None) -> None:
        self.spec = spec
        # The replicas' start, watch and drain; a failed or dead one comes back here (`_fail`, `_on_death`).
        self._replicas = ReplicaSet(actors or RayActors(), on_change, self._spawn, self._fail, self._on_death)
        self._restart_budget = RestartBudget()
        self.error: str | None = None
        self.updating = False
        self._on_change = on_change
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.target = initial_target(spec)
        self.autoscaler = Autoscaler(spec.autoscaling) if spec.autoscaling else None
        self.ongoing = 0.0  # the cluster-wide load last seen by the autoscaler
        self.events: list[ScalingEvent] = []
        self.events_total = 0
        self.no_room: str | None = None  # set while the autoscaler wants more but nothing fits

    # ---- what the controller reads -------------------------------------------------------------

    @property
    def replicas(self) -> list[ReplicaRecord]:
        """Every replica's record: the serving spec's, a rolling update's, draining and failed ones."""
        return self._replicas.records

    @property
    def restarts(self) -> int:
        """Replacements within the restart window (restart_budget.py)."""
        return self._restart_budget.used

    def count(self, state: ReplicaState) -> int:
        return sum(1 for r in self.replicas if r.state == state)

    @property
    def state(self) -> DeploymentState:
        ready = self.count("ready")
        if ready >= self.target:
            return "ready"
        if self.count("loading"):
            return "downloading" if self._downloading() else "loading"
        return "degraded" if ready else "failed"

    def _downloading(self) -> DownloadProgress | None:
        """The least advanced unfinished download among loading replicas."""
        pending = [
            r.download
            for r in self._replicas.current()
            if r.state == "loading" and r.download and not r.download.done
        ]
        return min(pending, key=lambda p: p.bytes_done / max(1, p.bytes_total)) if pending else None

    def status(self) -> DeploymentStatus:
        return DeploymentStatus(
            name=self.spec.name,
            state=self.state,
            error=self.error,
            ready=self.count("ready"),
            desired=self.target,
            restarts=self.restarts,
            updating=self.updating,
            routing=self.spec.routing.policy,
            autoscaled=self.spec.autoscaling is not None,
            ongoing=self.ongoing,
            scaling_events=list(self.events),
            spec=self.spec,
            replicas=[
                ReplicaStatus(
                    id=r.id,
                    state=r.state,
                    node_id=r.node_id,
                    error=r.error,
                    since=r.since,
                    download=r.download,
                )
                for r in self.replicas
            ],
            download=self._downloading(),
        )

    def route(self) -> DeploymentRoute:
        ready = [
            ReplicaRoute(r.id, r.actor, r.node_id or "", r.context_length, r.generation_defaults, r.socket)
            for r in self.replicas
            if r.state == "ready"
        ]
        return DeploymentRoute(
            self.spec,
            self.state,
            self.error,
            ready,
            self.restarts,
            self.target,
            list(self.events),
            self.events_total,
            self.no_room,
            self._downloading(),
        )

    # ---- operations ----------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Start replicas until the current spec has as many loading or ready ones as it asks for."""
        if self._closed:
            return
        live = [r for r in self._replicas.current() if r.state in ("loading", "ready")]
        for _ in range(self.target - len(live)):
            self._replicas.start(self.spec, self._replicas.generation)

    def scale(self, replicas: int, drain_timeout: float) -> None:
        """Change the (fixed) replica count. Removed replicas drain; the ones that stay are not touched."""
        self.spec = self.spec.model_copy(update={"replicas": replicas})
        self._restart_budget.reset()
        self.resize(replicas, drain_timeout, "admin scale", spec_changed=True)

    def resize(self, replicas: int, drain_timeout: float, reason: str, spec_changed: bool = False) -> None:
        """Aim at `replicas` from now on: start the missing ones, drain the surplus (what serves
        nobody yet first, then the newest ready ones), and record the change."""
        if replicas != self.target:
            self.events.append(
                ScalingEvent(at=time.time(), from_replicas=self.target, to_replicas=replicas, reason=reason)
            )
            del self.events[:-MAX_EVENTS]
            self.events_total += 1
            log.info("deployment %s: %d -> %d replica(s) (%s)", self.spec.name, self.target, replicas, reason)
        self.target = replicas
        self.no_room = None
        self._replicas.forget_failed()
        live = [r for r in self._replicas.current() if r.state in ("loading", "ready")]
        victims = sorted(live, key=lambda r: (r.state == "ready", -r.seq))[: max(0, len(live) - replicas)]
        for rec in victims:
            self._replicas.stop_soon(rec, drain_timeout)
        self.reconcile()
        self._on_change(spec_changed)

    def set_no_room(self, why: str | None) -> None:
        """Say (once per change) that the cluster has no room for the replica the autoscaler wants."""
        if why != self.no_room:
            self.no_room = why
            self._on_change(False)

    def loading(self) -> int:
        """Replicas of the serving spec still loading (the autoscaler counts them as on their way)."""
        return sum(1 for r in self._replicas.current() if r.state == "loading")

    def leaving(self) -> int:
        """Replicas draining or stopping: the resources they hold free up shortly."""
        return sum(1 for r in self.replicas if r.stopping and r.state != "failed")

    def update(self, spec: ModelConfig) -> None:
        """Apply a new spec. Only aliases / replicas / max_restarts changed: in place. Anything else
        (weights, engine, resources...): start a full new set, then drain the old one once every new
        replica is ready; if any fails, drop the new set and keep serving the old spec."""
        light = {"aliases", "replicas", "max_restarts", "autoscaling", "routing"}
        if self.spec.model_dump(exclude=light) == spec.model_dump(exclude=light):
            target = target_for(self.spec, spec, self.target)
            self._set_policy(spec)
            if target != self.target:
                self._restart_budget.reset()
                self.resize(target, UPDATE_DRAIN_SECONDS, "update", spec_changed=True)
            else:
                self._on_change(True)
            return
        self.updating = True
        self._replicas.forget_failed()
        self._spawn(self._roll(spec, self._replicas.generation + 1))
        self._on_change(False)

    async def undeploy(self, timeout: float) -> bool:
        """Drain and stop every replica; True if no in-flight request had to be cut."""
        self._closed = True
        for rec in self.replicas:
            self._replicas.begin_stop(rec)
        results = await asyncio.gather(*(self._replicas.stop(r, timeout) for r in list(self.replicas)))
        for task in list(self._tasks):
            task.cancel()
        return all(results)

    # ---- internals -----------------------------------------------------------------------------

    def _set_policy(self, spec: ModelConfig) -> None:
        if spec.autoscaling != self.spec.autoscaling:
            self.autoscaler = Autoscaler(spec.autoscaling) if spec.autoscaling else None
        self.spec = spec

    def set_adapters(self, adapters: list[AdapterConfig]) -> None:
        """A LoRA adapter loaded into (or unloaded from) the running replicas: the spec changes
        (persisted, and what new replicas load) without restarting anything."""
        self.spec = self.spec.model_copy(update={"adapters": adapters})
        self._on_change(True)

    def ready_actors(self) -> list[Any]:
        return [r.actor for r in self._replicas.current() if r.state == "ready"]

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- a replica that failed or died ---------------------------------------------------------

    def _fail(self, rec: ReplicaRecord, reason: str) -> None:
        rec.error = reason[:MAX_REASON_CHARS]
        self.error = f"replica {rec.id} {rec.error}"
        log.error("deployment %s: %s", self.spec.name, self.error)
        self._replicas.kill(rec)
        self._replicas.set_state(rec, "failed")

    async def _on_death(self, rec: ReplicaRecord, exc: BaseException) -> None:
        self._fail(rec, f"died: {describe_failure(exc)}")
        if self._closed or rec.generation != self._replicas.generation:
            return  # being removed, or part of an update that will notice the failure
        await self._replace(rec, rec.error or "died")

    async def _replace(self, rec: ReplicaRecord, death: str) -> None:
        """Start a replacement for the dead `rec` if the budget and the cluster allow; if only the
        budget refuses, try again when it allows (`_replace_later`)."""
        limit = self.spec.max_restarts
        wait = self._restart_budget.wait(limit)
        why = (
            None if wait is None else f"max_restarts={limit} reached within {self._restart_budget.window:g}s"
        )
        if why is None:
            why = await self._replicas.actors.check_feasible(self.spec)
        if self._closed or rec not in self.replicas:
            return
        if why is not None:
            if wait is None:  # the budget allows; the cluster has no room (a node is gone): look again
                wait = NO_ROOM_RETRY_SECONDS
                why = f"{why}; looking again every {wait:g}s"
                self._spawn(self._replace_later(rec, death, wait))
            elif wait != float("inf"):
                why = f"{why}; next try in {wait:.0f}s"
                self._spawn(self._replace_later(rec, death, wait))
            rec.error = f"{death}; not replaced: {why}"[:MAX_REASON_CHARS]
            self.error = f"replica {rec.id} {rec.error}"
            self._on_change(False)
            return
        self._restart_budget.record()
        self._replicas.records.remove(rec)
        self.error = (
            f"replica {rec.id} {death}; replaced ({self.restarts}/{limit} restarts used "
            f"within {self._restart_budget.window:g}s)"
        )
        log.warning("deployment %s: %s", self.spec.name, self.error)
        self._replicas.start(self.spec, self._replicas.generation)

    async def _replace_later(self, rec: ReplicaRecord, death: str, wait: float) -> None:
        await asyncio.sleep(wait)
        if self._closed or rec not in self.replicas or rec.state != "failed" or rec.stopping:
            return
        if rec.generation != self._replicas.generation:
            return
        await self._replace(rec, death)

    async def _roll(self, spec: ModelConfig, generation: int) -> None:
        count = target_for(self.spec, spec, self.target)
        fresh = [self._replicas.start(spec, generation) for _ in range(count)]
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
            await asyncio.gather(*(self._replicas.stop(r, UPDATE_DRAIN_SECONDS) for r in fresh))
            self.updating = False
            self._on_change(False)
            return
        old = [r for r in self.replicas if r.generation != generation]
        for rec in old:
            self._replicas.begin_stop(rec)
        self._set_policy(spec)
        self._replicas.generation = generation
        if count != self.target:
            self.resize(count, UPDATE_DRAIN_SECONDS, "update")
        self.error, self.updating = None, False
        self._restart_budget.reset()
        self._on_change(True)
        await asyncio.gather(*(self._replicas.stop(r, UPDATE_DRAIN_SECONDS) for r in old))
