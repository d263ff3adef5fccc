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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import ray

from raygate.backends.cluster.control.autoscaler import LoadReports
from raygate.backends.cluster.control.deployment import UPDATE_DRAIN_SECONDS, Deployment
from raygate.backends.cluster.control.registrations import Registrations
from raygate.backends.cluster.control.replica_actors import RayActors
from raygate.backends.cluster.routing.route_table import RouteTable
from raygate.backends.cluster.runtime.errors import remote_cause
from raygate.backends.cluster.runtime.placement import (
    check_feasible,
    invalid_options,
    room_for,
    state_actor_options,
)
from raygate.backends.cluster.stores.state_file import load_specs, save_specs
from raygate.backends.engines.hub_plan import hf_offline
from raygate.backends.engines.model_files import ModelFileError, resolve_adapter, resolve_model_file
from raygate.backends.engines.model_hub import pin, pin_projector
from raygate.backends.engines.options import check_engine_options
from raygate.protocol.admin import DeploymentStatus, UndeployResult
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError, ConflictError, ModelNotFoundError, OpenAIError
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
        self._check_ids(spec)
        spec = await self._validate(spec)
        self._check_ids(spec)  # another deploy may have taken the name while we validated
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
        self._check_ids(spec, replacing=name)
        spec = await self._validate(spec)
        deployment = self._idle(name)
        self._check_ids(spec, replacing=name)
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

    # ---- LoRA adapters (docs/lora.md) ---------------------------------------------------------

    async def load_adapter(self, base: str | None, adapter: AdapterConfig) -> DeploymentStatus:
        """Load `adapter` into every ready replica of `base`, then add it to the spec (persisted;
        what new replicas load). A replica that refuses it undoes the others: all or none."""
        self._boot()
        deployment = self._adapter_base(base)
        name = adapter.name
        for other in self._deployments.values():
            if name in _all_ids(other.spec):
                raise BadRequestError(
                    f"`{name}` is already a model or adapter of deployment `{other.spec.name}`.",
                    param="lora_name",
                    code="model_exists",
                )
        if deployment.spec.backend == "vllm" and adapter.scale != 1.0:
            raise BadRequestError(
                f"LoRA adapter `{name}`: vLLM applies adapters at `scale` 1.0 only.", param="scale"
            )
        path = adapter.source.path
        if path is not None and not (Path(path).is_absolute() or path.startswith("~")):
            raise BadRequestError(
                f"`lora_path` must be absolute or a Hub id `hf:ORG/REPO` (got `{path}`).", param="lora_path"
            )
        try:
            adapter = await self._pinned(adapter, deployment.spec)
        except BadRequestError as exc:
            raise BadRequestError(exc.message, param="lora_path") from None
        actors = deployment.ready_actors()
        if not actors and adapter.source.hub is None:  # none to ask: at least the file must be here
            try:
                await asyncio.to_thread(resolve_adapter, adapter.source, deployment.spec.backend)
            except ModelFileError as exc:
                raise BadRequestError(f"LoRA adapter `{name}`: {exc}", param="lora_path") from None
        loaded: list[Any] = []
        try:
            for actor in actors:
                await actor.load_adapter.remote(name, adapter.source)
                loaded.append(actor)
        except Exception as exc:
            for actor in loaded:
                with contextlib.suppress(Exception):
                    await actor.unload_adapter.remote(name)
            cause = remote_cause(exc)
            if isinstance(cause, OpenAIError):
                raise cause from None
            raise BadRequestError(f"Cannot load LoRA adapter `{name}`: {exc}", param="lora_path") from None
        deployment.set_adapters([*deployment.spec.adapters, adapter])
        log.info("loaded LoRA adapter %s on %s", name, deployment.spec.name)
        return deployment.status()

    async def unload_adapter(self, name: str) -> DeploymentStatus:
        """Take `name` off its model: refused to new requests at once, its running requests finish."""
        self._boot()
        for deployment in self._deployments.values():
            kept = [a for a in deployment.spec.adapters if a.name != name]
            if len(kept) == len(deployment.spec.adapters):
                continue
            deployment.set_adapters(kept)  # gateways stop sending requests for it first
            for actor in deployment.ready_actors():
                with contextlib.suppress(Exception):  # a replica that has not got it has nothing to do
                    await actor.unload_adapter.remote(name)
            log.info("unloaded LoRA adapter %s from %s", name, deployment.spec.name)
            return deployment.status()
        raise ModelNotFoundError(f"There is no LoRA adapter named `{name}`.", param="lora_name")

    def _adapter_base(self, base: str | None) -> Deployment:
        """The deployment an adapter goes on: the one named (name or alias), or the only one that
        can take adapters (vLLM's server has one model, and its body names none)."""
        able = [d for d in self._deployments.values() if d.spec.takes_adapters]
        if base is None:
            if len(able) != 1:
                raise BadRequestError(
                    "Name the model the adapter goes on in `base_model_name`: "
                    f"{len(able)} deployments can take LoRA adapters.",
                    param="base_model_name",
                )
            return able[0]
        for deployment in self._deployments.values():
            if base in deployment.spec.ids:
                if deployment not in able:
                    raise BadRequestError(
                        f"Model `{base}` cannot take LoRA adapters (llama.cpp generation models "
                        "can, and vLLM ones started with `enable_lora`).",
                        param="base_model_name",
                    )
                return deployment
        raise ModelNotFoundError(f"There is no deployment named `{base}`.", param="base_model_name")

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

    # ---- checks --------------------------------------------------------------------------------

    def _idle(self, name: str) -> Deployment:
        deployment = self._get(name)
        if deployment.updating:
            raise ConflictError(f"Deployment `{name}` is being updated; try again when it settles.")
        return deployment

    def _check_ids(self, spec: ModelConfig, replacing: str | None = None) -> None:
        if replacing is None and spec.name in self._deployments:
            raise BadRequestError(
                f"A deployment named `{spec.name}` already exists; scale or update it, or undeploy it first.",
                param="name",
                code="model_exists",
            )
        if len(set(spec.ids)) != len(spec.ids):
            raise BadRequestError("A model id is listed twice in name + aliases.", param="aliases")
        for other in self._deployments.values():
            if other.spec.name in (spec.name, replacing):
                continue
            taken = sorted(_all_ids(spec) & _all_ids(other.spec))
            if taken:
                raise BadRequestError(
                    f"Model id `{taken[0]}` is already served by deployment `{other.spec.name}`.",
                    param="name" if taken[0] == spec.name else "aliases",
                    code="model_exists",
                )

    async def _validate(self, spec: ModelConfig) -> ModelConfig:
        """What can be known before starting anything: the weights exist (on this node, or on their
        Hub: then the spec comes back with its revision pinned to a commit) and some node of the
        cluster is big enough for one replica."""
        if spec.source is not None and spec.source.hub is not None:
            try:
                source = await asyncio.to_thread(pin, spec.source, folder=spec.backend == "vllm")
            except ModelFileError as exc:
                raise BadRequestError(str(exc), param="source") from None
            spec = spec.model_copy(update={"source": source})
            spec = await self._pin_projector(spec)
        elif spec.source is not None:
            if spec.source.path is not None and not Path(spec.source.path).is_absolute():
                raise BadRequestError(
                    f"`source.path` must be absolute (got `{spec.source.path}`).", param="source"
                )
            try:
                await asyncio.to_thread(resolve_model_file, spec.source, folder=spec.backend == "vllm")
            except ModelFileError as exc:
                raise BadRequestError(str(exc), param="source") from None
        spec = spec.model_copy(update={"adapters": [await self._pinned(a, spec) for a in spec.adapters]})
        try:
            check_engine_options(spec)
        except ValueError as exc:
            raise BadRequestError(f"{exc}.", param="engine") from None
        bad = invalid_options(spec)
        if bad is not None:
            raise BadRequestError(f"Invalid resources: {bad}.", param="resources")
        why = await check_feasible(spec)
        if why is not None:
            raise BadRequestError(f"Impossible resources: {why}.", param="resources")
        return spec

    @staticmethod
    async def _pinned(adapter: AdapterConfig, spec: ModelConfig) -> AdapterConfig:
        """A LoRA adapter from a Hub, its revision pinned to a commit like a model's (a 400 naming
        the adapter when its repository holds nothing it could load); others as they are."""
        if adapter.source.hub is None:
            return adapter
        try:
            source = await asyncio.to_thread(pin, adapter.source, folder=spec.backend == "vllm")
        except ModelFileError as exc:
            raise BadRequestError(f"LoRA adapter `{adapter.name}`: {exc}", param="adapters") from None
        return adapter.model_copy(update={"source": source})

    @staticmethod
    async def _pin_projector(spec: ModelConfig) -> ModelConfig:
        """A llama.cpp vision model from a Hub GGUF repository without a `vision.projector` takes
        the repository's `mmproj` GGUF, pinned like the model (a 400 when it has none or several);
        a projector given from a Hub is pinned too. vLLM reads its vision tower from the folder."""
        vision, source = spec.vision, spec.source
        if vision is None or source is None or spec.backend != "llama_cpp":
            return spec
        try:
            if vision.projector is None and source.hub is not None and not hf_offline():
                projector = await asyncio.to_thread(pin_projector, source)
            elif vision.projector is not None and vision.projector.hub is not None:
                projector = await asyncio.to_thread(pin, vision.projector, folder=False)
            else:
                return spec
        except ModelFileError as exc:
            raise BadRequestError(str(exc), param="vision.projector") from None
        return spec.model_copy(update={"vision": vision.model_copy(update={"projector": projector})})


def _all_ids(spec: ModelConfig) -> set[str]:
    """Every `model` that reaches `spec`: its name, aliases and adapters."""
    return {*spec.ids, *(a.name for a in spec.adapters)}


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
