"""This gateway's view of the models: a cache of the controller's routing table.

Requests are routed from the cache, never by asking the controller: a long poll (`watch`) brings
each change (deploy, a replica becoming ready, a death, a drain) within one round trip of it
happening. Admin calls go to the controller and then refresh the cache at once, so a gateway
always sees its own changes. If the controller disappears (its node died, someone killed it), the
gateway recreates it, which restores the registry from the state file.

For autoscaled models the gateway also reports its load to the controller (`report_load`): the
ongoing requests per model, every `REPORT_SECONDS`, and at once when a request finds the model at
zero replicas (scale from zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayActorError

from raygate.backends.cluster.control.autoscaler import REPORT_SECONDS
from raygate.backends.cluster.routing.route_table import RouteTable
from raygate.backends.cluster.routing.router import ModelRouter
from raygate.backends.cluster.runtime.errors import CONTROLLER_ERRORS
from raygate.protocol.errors import ModelLoadingError, ModelNotFoundError, ServiceUnavailableError
from raygate.protocol.lora import AdapterConfig

log = logging.getLogger(__name__)

WATCH_SECONDS = 30.0
RECONNECT_SECONDS = 1.0
# A Ray call that has not answered this long after its own timeout is treated as failed.
CALL_SLACK_SECONDS = 15.0


class ControllerError(RuntimeError):
    """The controller could not be created or reached (e.g. an unreadable state file)."""


class ControllerClient:
    """This gateway's cache of the controller's route table (module docstring): routes from it, keeps it fresh
    with `watch`, and recreates a vanished controller."""

    def __init__(
        self, connect: Callable[[], Any], on_lost: Callable[[], None] | None = None, lost_after: float = 60.0
    ) -> None:
        """`on_lost` is called once if the controller stays unreachable and cannot be recreated
        for `lost_after` seconds: the Ray cluster itself is gone (e.g. its head restarted), and
        only a new process can join the new one."""
        self._connect = connect
        self._on_lost = on_lost
        self._lost_after = lost_after
        self.reachable = True  # False from a failed watch until the next answer: /ready says 503
        self._controller: Any = None
        self._routers: dict[str, ModelRouter] = {}
        self._by_id: dict[str, ModelRouter] = {}
        self._version = -1
        self._watcher: asyncio.Task[None] | None = None
        self._reporter: asyncio.Task[None] | None = None
        self._demand = asyncio.Event()
        self.gateway_id = uuid.uuid4().hex
        # Requests queued in this gateway for a model, before its router (the app wires admission in).
        self.queued: Callable[[str], int] = lambda name: 0
        self.created = int(time.time())

    async def start(self) -> dict[str, Any]:
        """Reach (or create) the controller and load the first table; returns the controller's info."""
        self._controller = await asyncio.to_thread(self._connect)
        try:
            info: dict[str, Any] = await self._controller.info.remote()
        except RayActorError as exc:  # its constructor raised: Ray keeps only the message
            raise ControllerError(f"the Raygate controller could not start: {exc}") from None
        await self.refresh()
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        self._reporter = asyncio.get_running_loop().create_task(self._report_forever())
        return info

    async def wait_settled(self, timeout: float) -> list[Any]:
        statuses: list[Any] = await self._controller.wait_settled.remote(timeout)
        await self.refresh()
        return statuses

    async def refresh(self, wait: float = 0.0) -> None:
        table: RouteTable = await self._controller.watch.remote(self._version, wait)
        self._apply(table)

    async def _watch(self) -> None:
        failing_since: float | None = None
        while True:
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the cancel of shutdown().
                async with asyncio.timeout(WATCH_SECONDS + CALL_SLACK_SECONDS):
                    await self.refresh(WATCH_SECONDS)
                failing_since = None
                self.reachable = True
                continue
            except (RayActorError, TimeoutError) as exc:
                # From this moment, not after the reconnect below: a /ready that still said 200
                # for those seconds sent requests to replicas that died with the controller's node.
                self.reachable = False
                log.warning(
                    "controller unreachable (%s); reconnecting", (str(exc) or repr(exc)).splitlines()[0]
                )
                await asyncio.sleep(RECONNECT_SECONDS)
                self._version = -1  # a new controller counts versions from zero again
                try:
                    async with asyncio.timeout(CALL_SLACK_SECONDS):
                        self._controller = await asyncio.to_thread(self._connect)
                except Exception:
                    log.exception("cannot recreate the controller")
            except Exception:
                self.reachable = False
                log.exception("routing table refresh failed")
                await asyncio.sleep(RECONNECT_SECONDS)
            failing_since = failing_since or time.monotonic()
            if self._on_lost is not None and time.monotonic() - failing_since > self._lost_after:
                log.error(
                    "the controller has been unreachable for %.0f s and cannot be recreated: the Ray "
                    "cluster is gone; stopping so that a supervisor restarts this gateway into the new one",
                    self._lost_after,
                )
                self._on_lost()
                return

    def load(self) -> dict[str, float]:
        """This gateway's ongoing requests per autoscaled model: inside the router (running, or
        waiting for a replica) plus queued for admission."""
        return {
            name: float(router.ongoing + self.queued(name))
            for name, router in self._routers.items()
            if router.config.autoscaling is not None
        }

    async def _report_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._demand.wait(), REPORT_SECONDS)
            self._demand.clear()
            load = self.load()
            if not load:
                continue
            try:
                await self._controller.report_load.remote(self.gateway_id, load)
            except Exception as exc:  # the watcher reconnects; the next report goes to the new one
                log.debug("load report failed: %s", exc)
                await asyncio.sleep(RECONNECT_SECONDS)

    def _apply(self, table: RouteTable) -> None:
        if table.version <= self._version:
            return
        routers: dict[str, ModelRouter] = {}
        for route in table.deployments:
            router = self._routers.get(route.spec.name) or ModelRouter(route.spec, [])
            router.on_demand = self._demand.set
            router.update(route)
            routers[route.spec.name] = router
        self._routers = routers
        self._by_id = {model_id: r for r in routers.values() for model_id in r.config.ids}
        # LoRA adapters reach their base model's router: `model: <adapter>` (docs/lora.md).
        self._by_id.update(
            {a.name: r for r in routers.values() for a in r.config.adapters if a.name not in self._by_id}
        )
        self._version = table.version

    # ---- the request path ----------------------------------------------------------------------

    def get(self, model_id: str) -> ModelRouter:
        """The router for a servable model; 404 if unknown, 503 (+ Retry-After) while it loads."""
        router = self._by_id.get(model_id)
        if router is None:
            raise ModelNotFoundError.for_model(model_id)
        if not router.replicas and not router.servable():
            name = router.config.name
            if router.state in ("downloading", "loading"):
                raise ModelLoadingError(f"Model `{name}` is loading; retry shortly.", param="model")
            raise ServiceUnavailableError(
                f"Model `{name}` has no ready replica: {router.error or 'none is running'}", param="model"
            )
        return router

    def adapter(self, model_id: str) -> AdapterConfig | None:
        """The LoRA adapter `model_id` names, if it names one (its router is `get(model_id)`)."""
        router = self._by_id.get(model_id)
        if router is None or model_id in router.config.ids:
            return None
        return next((a for a in router.config.adapters if a.name == model_id), None)

    def model_ids(self) -> list[str]:
        """Ids (names and aliases) of the models that can serve: a ready replica, or autoscaled (a
        request starts one)."""
        return [model_id for model_id, r in self._by_id.items() if r.servable()]

    def routers(self) -> list[ModelRouter]:
        return list(self._routers.values())

    # ---- the admin path ------------------------------------------------------------------------

    async def admin(self, method: str, *args: Any) -> Any:
        """Call a controller operation; its typed errors (400/404/409) reach the client as they are."""
        with CONTROLLER_ERRORS.raising("controller"):
            result = await getattr(self._controller, method).remote(*args)
        await self.refresh()  # this gateway sees its own change at once
        return result

    async def shutdown(self) -> None:
        """Stop watching. Replicas and the controller stay: they belong to the cluster, not to this
        gateway (an embedded Ray takes them down with it)."""
        for task in (self._watcher, self._reporter):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._routers.clear()
        self._by_id.clear()
