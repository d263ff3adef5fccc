"""The replicas of one deployment, each from its start to its kill: the mechanics under `Deployment`.

A replica goes loading -> ready, and is then watched with a call that never returns
(`ModelWorker.watch`): Ray fails that call the moment the actor or its node dies, so deaths are
noticed without polling. Actors are started, killed and placed through `ReplicaActors`
(replica_actors.py).

Replicas that are removed on purpose (scale down, update, undeploy) are drained first: out of
routing, new requests turned away to other replicas, running ones finished (bounded by a timeout),
then killed.

Its own room because it carries out what the deployment decides (deployment.py: how many replicas,
which spec, whether a dead one is replaced) and decides nothing itself: a replica that fails to load
or dies is handed back to the deployment (`on_load_failed`, `on_death`). Like the deployment, it runs
on the controller's event loop: no locks, and code after an `await` re-checks `stopping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import RayActorError

from raygate.backends.cluster.control.replica_actors import ReplicaActors, describe_failure, wait_started
from raygate.protocol.admin import DownloadProgress, ReplicaState
from raygate.protocol.config import ModelConfig

log = logging.getLogger(__name__)

OnChange = Callable[[bool], None]  # called with spec_changed=True when the spec must be persisted
Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]


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
    socket: str = ""
    download: DownloadProgress | None = None  # while (and after) it fetches Hub weights
    stopping: bool = False
    task: asyncio.Task[None] | None = None


OnLoadFailed = Callable[[ReplicaRecord, str], None]  # the replica and why, as one line
OnDeath = Callable[[ReplicaRecord, BaseException], Awaitable[None]]


class ReplicaSet:
    """Every replica record of one deployment (the serving spec's, a rolling update's, draining and
    failed ones), and the start, watch and stop of each. `generation` is the spec being served."""

    def __init__(
        self,
        actors: ReplicaActors,
        on_change: OnChange,
        spawn: Spawn,
        on_load_failed: OnLoadFailed,
        on_death: OnDeath,
    ) -> None:
        self.actors = actors
        self.records: list[ReplicaRecord] = []
        self.generation = 0
        self._seq = itertools.count(1)
        self._on_change = on_change
        self._spawn = spawn
        self._on_load_failed = on_load_failed
        self._on_death = on_death

    def current(self) -> list[ReplicaRecord]:
        """Replicas of the serving spec that are not on their way out."""
        return [r for r in self.records if r.generation == self.generation and not r.stopping]

    def forget_failed(self) -> None:
        self.records = [r for r in self.records if r.state != "failed"]

    def set_state(self, rec: ReplicaRecord, state: ReplicaState) -> None:
        rec.state, rec.since = state, time.time()
        self._on_change(False)

    # ---- start ---------------------------------------------------------------------------------

    def start(self, spec: ModelConfig, generation: int) -> ReplicaRecord:
        seq = next(self._seq)
        actor = self.actors.start(spec, seq)
        rec = ReplicaRecord(id=f"{spec.name}#{seq}", seq=seq, actor=actor, generation=generation)
        self.records.append(rec)
        rec.task = self._spawn(self._run(rec, spec))
        self._on_change(False)
        return rec

    async def _run(self, rec: ReplicaRecord, spec: ModelConfig) -> None:
        t0 = time.monotonic()
        try:
            info = await wait_started(
                self.actors,
                rec.actor,
                spec,
                self._progress_of(rec) if spec.source and spec.source.hub else None,
            )
        except RayActorError as exc:  # the process or its node died while loading
            if not rec.stopping:
                await self._on_death(rec, exc)
            return
        except Exception as exc:  # the engine could not load: retrying would fail the same way
            if not rec.stopping:
                self._on_load_failed(rec, f"could not load: {describe_failure(exc)}")
            return
        if rec.stopping:
            return
        rec.node_id, rec.context_length = str(info["node_id"]), int(info["context_length"])
        rec.generation_defaults = dict(info.get("generation_defaults") or {})
        rec.socket = str(info.get("socket") or "")
        if info.get("download"):
            rec.download = DownloadProgress.model_validate(info["download"])
        log.info("replica %s ready on node %s in %.1fs", rec.id, rec.node_id[:12], time.monotonic() - t0)
        self.set_state(rec, "ready")
        try:
            await rec.actor.watch.remote()
        except Exception as exc:
            if not rec.stopping:
                await self._on_death(rec, exc)

    def _progress_of(self, rec: ReplicaRecord) -> Callable[[dict[str, Any] | None], None]:
        """What `wait_started` calls with each reading of the replica's download: recorded, and
        published (gateways and `/admin` see the bytes move)."""

        def record(progress: dict[str, Any] | None) -> None:
            if progress is None or rec.stopping:
                return
            reading = DownloadProgress.model_validate(progress)
            if reading != rec.download:
                rec.download = reading
                self._on_change(False)

        return record

    # ---- stop ----------------------------------------------------------------------------------

    def kill(self, rec: ReplicaRecord) -> None:
        """Kill `rec`'s actor, which frees its resources (a no-op if it is already dead)."""
        with contextlib.suppress(Exception):
            self.actors.kill(rec.actor)

    def stop_soon(self, rec: ReplicaRecord, timeout: float) -> None:
        """Take `rec` out of routing now (so the status returned to the caller already says
        `draining`) and finish stopping it in the background."""
        self.begin_stop(rec)
        self._spawn(self.stop(rec, timeout))

    def begin_stop(self, rec: ReplicaRecord) -> None:
        if rec.stopping:
            return
        rec.stopping = True
        if rec.state == "ready":
            self.set_state(rec, "draining")  # gateways drop it from routing on this change

    async def stop(self, rec: ReplicaRecord, timeout: float) -> bool:
        """Drain (if it was serving) and kill one replica. True if nothing in flight had to be cut."""
        self.begin_stop(rec)
        drained = True
        if rec.state == "draining":
            try:
                drained = bool(await asyncio.wait_for(rec.actor.drain.remote(timeout), timeout + 10))
            except Exception:
                drained = False  # already dead, or stuck
        if rec.task is not None:
            rec.task.cancel()
        self.kill(rec)
        if rec in self.records:
            self.records.remove(rec)
        self._on_change(False)
        return drained
