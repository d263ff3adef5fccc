"""The controller: the one registry of deployments, a named detached Ray actor.

Every gateway attached to the cluster (several `raygate serve` processes, on one node or many)
finds the same controller by name in the Raygate namespace, so they share one registry and one set
of replicas. Gateways do not call it per request: each keeps the latest `RouteTable`, refreshed by
a long poll (`watch`) that returns as soon as anything changes.

The specs are persisted to `<state_dir>/registry.json` on every change. A new controller restores
them from there; only when there is no registry file yet does the gateway's config seed it. The
controller is pinned to the node of the gateway that created it, so the state directory it writes
is that gateway's, unless `--state-resource` names the node that holds the state (a Ray head that
outlives gateway restarts: ARCHITECTURE.md, "Where the controller lives").

Autoscaled deployments are resized here, every `AUTOSCALE_TICK_SECONDS`, from the load all
gateways report (`report_load`; `autoscaler.py` decides), never beyond what the cluster can place
now (`placement.room_for`, less the replicas still loading, which may not hold theirs yet, plus
the ones leaving, which give theirs back).

What a spec must pass before anything starts (ids free, weights there and Hub-pinned, resources
feasible) is in deploy_checks.py; loading a LoRA adapter into running replicas, in adapters.py; one
deployment's replicas, in deployment.py and replica_set.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import ray

from raygate.backends.cluster.control import adapters
from raygate.backends.cluster.control.autoscaler import LoadReports
from raygate.backends.cluster.control.deploy_checks import check_ids, validate
from raygate.backends.cluster.control.deployment import UPDATE_DRAIN_SECONDS, Deployment
from raygate.backends.cluster.control.registrations import Registrations
from raygate.backends.cluster.control.replica_actors import RayActors
from raygate.backends.cluster.routing.route_table import RouteTable
from raygate.backends.cluster.runtime.placement import room_for, state_actor_options
from raygate.backends.cluster.stores.state_file import load_specs, save_specs
from raygate.protocol.admin import DeploymentStatus, UndeployResult
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError, ConflictError, ModelNotFoundError
from raygate.protocol.lora import AdapterConfig
from raygate.protocol.xinference import LaunchRequest, ModelFamily

log = logging.getLogger(__name__)

CONTROLLER_NAME = "controller"
SETTLE_POLL_SECONDS = 0.2
AUTOSCALE_TICK_SECONDS = 0.2


class Controller:
    """The registry actor of the module docstring: owns every `Deployment`, persists their specs, and versions
    the route table that gateways watch."""

    def __init__(
        self, state_dir: str | None, seed: list[ModelConfig], builtins: list[ModelConfig] | None = None
    ) -> None:
        self._state_dir = Path(state_dir) if state_dir else None
        restored = load_specs(self._state_dir) if self._state_dir else None
        self._registrations = Registrations(self._state_dir, builtins or [])
        self._restored = restored is not None
        self._initial = restored if restored is not None else list(seed)
        self._deployments: dict[str, Deployment] = {}
        self._version = 0
        self._changed: asyncio.Event | None = None
        self._loads = LoadReports()
        self._autoscaling: asyncio.Task[None] | None = None

    def _boot(self) -> asyncio.Event:
        """Start the initial deployments on the first call: replicas need the actor's event loop,
        which `__init__` does not run on."""
        if self._changed is not None:
            return self._changed
        self._changed = asyncio.Event()
        for spec in self._initial:  # all known before any starts: see `_reserved_resources`
            self._deployments[spec.name] = self._deployment(spec)
        for deployment in list(self._deployments.values()):
            deployment.reconcile()
        if not self._restored:
            self._persist()  # the config seeded the registry: from now on the file is the truth
        self._autoscaling = asyncio.get_running_loop().create_task(self._autoscale_forever())
        return self._changed

    def _deployment(self, spec: ModelConfig) -> Deployment:
        return Deployment(spec, self._on_change, RayActors(self._reserved_resources))

    def _reserved_resources(self, name: str) -> set[str]:
        """The custom Ray resources the deployments other than `name` request (placement.py's
        `preferred_node` keeps the replicas of a model that requests none off the nodes offering them)."""
        return {key for other, d in self._deployments.items() if other != name for key in d.spec.resources}

    def _on_change(self, spec_changed: bool) -> None:
        if spec_changed:
            self._persist()
        self._version += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _persist(self) -> None:
        # A few hundred bytes, written synchronously so that writes land in the order of changes.
        if self._state_dir is not None:
            save_specs(self._state_dir, [d.spec for d in self._deployments.values()])

    def _table(self) -> RouteTable:
        return RouteTable(self._version, [d.route() for d in self._deployments.values()])

    def _get(self, name: str) -> Deployment:
        deployment = self._deployments.get(name)
        if deployment is None:
            raise ModelNotFoundError(f"There is no deployment named `{name}`.", param="name")
        return deployment

    # ---- read ----------------------------------------------------------------------------------

    async def info(self) -> dict[str, Any]:
        self._boot()
        return {
            "state_dir": str(self._state_dir) if self._state_dir else None,
            "restored": self._restored,
            "node_id": ray.get_runtime_context().get_node_id(),
            "deployments": list(self._deployments),
        }

    async def watch(self, after_version: int, timeout: float) -> RouteTable:
        """The routing table, as soon as it is newer than `after_version` (or after `timeout` s)."""
        changed = self._boot()
        if self._version <= after_version and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
        return self._table()

    async def list_deployments(self) -> list[DeploymentStatus]:
        self._boot()
        return [d.status() for d in self._deployments.values()]

    async def get(self, name: str) -> DeploymentStatus:
        self._boot()
        return self._get(name).status()

    async def wait_settled(self, timeout: float) -> list[DeploymentStatus]:
        """Return once no replica is loading (or after `timeout` s): a starting gateway waits for this."""
        self._boot()
        deadline = time.monotonic() + timeout
        # A poll, not an event: replica states change in many places; this runs once per start.
        while time.monotonic() < deadline and any(d.count("loading") for d in self._deployments.values()):  # noqa: ASYNC110
            await asyncio.sleep(SETTLE_POLL_SECONDS)
        return [d.status() for d in self._deployments.values()]

    # ---- autoscaling ---------------------------------------------------------------------------

    async def report_load(self, gateway: str, load: dict[str, float]) -> None:
        """A gateway's ongoing requests per autoscaled model; a request waiting at zero replicas
        makes its gateway report at once, so scale from zero starts on the next tick."""
        self._boot()
        self._loads.report(gateway, load, time.monotonic())

    async def _autoscale_forever(self) -> None:
        while True:
            await asyncio.sleep(AUTOSCALE_TICK_SECONDS)
            try:
                await self._autoscale_once()
            except Exception:
                log.exception("autoscaling pass failed")

    async def _autoscale_once(self) -> None:
        now = time.monotonic()
        for name, deployment in list(self._deployments.items()):
            scaler = deployment.autoscaler
            if scaler is None or deployment.updating:
                continue
            ongoing = self._loads.total(name, now)
            if ongoing != deployment.ongoing:
                deployment.ongoing = ongoing
            decision = scaler.decide(deployment.target, ongoing, now)
            if decision is None:
                # No replica wanted now, so none lacks room. A stale `no_room` made the gateways refuse
                # every request at once (503 no_capacity) without reporting it as load, so no tick
                # ever asked for a replica again, even after the node that has room came back.
                deployment.set_no_room(None)
                continue
            replicas = decision.replicas
            if replicas > deployment.target:
                # Loading replicas may not hold their resources yet; leaving ones give theirs back.
                room = await room_for(deployment.spec) - deployment.loading() + deployment.leaving()
                if self._deployments.get(name) is not deployment or deployment.updating:
                    continue  # undeployed or updated meanwhile
                replicas = min(replicas, deployment.target + max(0, room))
                if replicas <= deployment.target:  # no room now: asked again next tick
                    deployment.set_no_room(f"no node has room for another replica ({room} free slots)")
                    continue
            deployment.resize(replicas, UPDATE_DRAIN_SECONDS, decision.reason)

    # ---- change --------------------------------------------------------------------------------

    async def deploy(self, spec: ModelConfig) -> DeploymentStatus:
        self._boot()
        check_ids(spec, self._specs())
        spec = await validate(spec)
        check_ids(spec, self._specs())  # another deploy may have taken the name while we validated
        deployment = self._deployment(spec)
        self._deployments[spec.name] = deployment
        try:
            deployment.reconcile()
        except Exception as exc:  # nothing was persisted yet: leave the registry as it was
            del self._deployments[spec.name]
            await deployment.undeploy(0)
            raise BadRequestError(f"Cannot start replicas for `{spec.name}`: {exc}", param="name") from None
        self._on_change(True)
        log.info("deployed %s (%d replica(s))", spec.name, deployment.target)
        return deployment.status()

    async def scale(self, name: str, replicas: int, drain_timeout: float) -> DeploymentStatus:
        self._boot()
        deployment = self._idle(name)
        if deployment.spec.autoscaling is not None:
            raise BadRequestError(
                f"Deployment `{name}` is autoscaled: change `autoscaling.min_replicas` / "
                "`autoscaling.max_replicas` with an update instead of `replicas`.",
                param="replicas",
            )
        deployment.scale(replicas, drain_timeout)
        log.info("scaled %s to %d replica(s)", name, replicas)
        return deployment.status()

    async def update(self, name: str, spec: ModelConfig) -> DeploymentStatus:
        self._boot()
        if spec.name != name:
            raise BadRequestError(
                f"The spec names `{spec.name}` but the request is for `{name}`; renaming is "
                "deploy + undeploy.",
                param="name",
            )
        self._idle(name)
        check_ids(spec, self._specs(), replacing=name)
        spec = await validate(spec)
        deployment = self._idle(name)
        check_ids(spec, self._specs(), replacing=name)
        deployment.update(spec)
        return deployment.status()

    async def undeploy(self, name: str, timeout: float) -> UndeployResult:
        self._boot()
        deployment = self._get(name)
        del self._deployments[name]
        self._on_change(True)  # gateways stop routing to it now; draining continues below
        t0 = time.monotonic()
        drained = await deployment.undeploy(timeout)
        log.info("undeployed %s (drained=%s)", name, drained)
        return UndeployResult(name=name, drained=drained, seconds=round(time.monotonic() - t0, 3))

    # ---- LoRA adapters (docs/lora.md; adapters.py) ---------------------------------------------

    async def load_adapter(self, base: str | None, adapter: AdapterConfig) -> DeploymentStatus:
        self._boot()
        deployment = await adapters.load_adapter(self._deployments, base, adapter)
        log.info("loaded LoRA adapter %s on %s", adapter.name, deployment.spec.name)
        return deployment.status()

    async def unload_adapter(self, name: str) -> DeploymentStatus:
        self._boot()
        deployment = await adapters.unload_adapter(self._deployments, name)
        log.info("unloaded LoRA adapter %s from %s", name, deployment.spec.name)
        return deployment.status()

    # ---- Xinference's face of the registry (protocol/xinference.py) ---------------------------

    async def registrations(self, model_type: str, detailed: bool) -> list[dict[str, Any]]:
        return self._registrations.list(model_type, detailed)

    async def registration(self, model_type: str, name: str) -> ModelFamily:
        return self._registrations.get(model_type, name).family

    async def prompt_styles(self) -> dict[str, dict[str, Any]]:
        return self._registrations.prompt_styles()

    async def register(self, model_type: str, family: dict[str, Any], persist: bool) -> None:
        self._registrations.register(model_type, family, persist)
        log.info("registered %s model %s (persist=%s)", model_type, family.get("model_name"), persist)

    async def unregister(self, model_type: str, name: str) -> None:
        self._registrations.unregister(model_type, name)
        log.info("unregistered %s model %s", model_type, name)

    async def launch(self, request: LaunchRequest) -> DeploymentStatus:
        """A registration launched by name: an ordinary deploy of the spec it builds."""
        self._boot()
        return await self.deploy(self._registrations.launch_spec(request))

    # ---- checks (deploy_checks.py) ---------------------------------------------------------------

    def _idle(self, name: str) -> Deployment:
        deployment = self._get(name)
        if deployment.updating:
            raise ConflictError(f"Deployment `{name}` is being updated; try again when it settles.")
        return deployment

    def _specs(self) -> dict[str, ModelConfig]:
        """Every deployment's spec by name: what a new spec's ids are checked against."""
        return {name: d.spec for name, d in self._deployments.items()}


def connect_controller(
    state_dir: Path | None,
    seed: list[ModelConfig],
    builtins: list[ModelConfig] | None = None,
    state_resource: str | None = None,
) -> Any:
    """The cluster's controller: the existing one, or a new one on this node, or on the node offering
    `state_resource` (`placement.state_actor_options`), restored from `state_dir`, else seeded with
    `seed`; `builtins`: what Xinference's API lists as built-in. Get-or-create is atomic in Ray, so
    gateways starting together still end up with one controller."""
    return (
        ray.remote(Controller)
        .options(
            name=CONTROLLER_NAME,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=1000,
            **state_actor_options(state_resource),
        )
        .remote(str(state_dir) if state_dir else None, seed, builtins)
    )
