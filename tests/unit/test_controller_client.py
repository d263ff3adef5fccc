"""backends/cluster/control/controller_client.py: when the controller stays unreachable and cannot be
recreated (the Ray cluster is gone, e.g. its head container restarted), the gateway gives up once,
so that a restart policy brings it into the new cluster, and says not-ready meanwhile; a reachable
or recreated controller never trips it.
The controller is a fake shaped like a Ray actor handle; Ray itself is never started."""

from __future__ import annotations

import asyncio
from typing import Any

from ray.exceptions import RayActorError

from raygate.backends.cluster.control import controller_client
from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.backends.cluster.routing.route_table import RouteTable


class _Method:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class FakeController:
    def __init__(self, alive: bool) -> None:
        self.alive = alive

        async def watch(after: int, wait: float) -> RouteTable:
            if not self.alive:
                raise RayActorError()
            await asyncio.sleep(min(wait, 0.01))
            return RouteTable(after + 1, [])

        self.watch = _Method(watch)


async def _run(alive: bool, reconnects: bool, seconds: float) -> list[object]:
    lost: list[str] = []
    controller = FakeController(alive)

    def connect() -> FakeController:
        if not reconnects:
            raise ConnectionError("GCS unreachable")
        controller.alive = True
        return controller

    client = ControllerClient(connect, on_lost=lambda: lost.append("lost"), lost_after=0.2)
    client._controller = controller
    task = asyncio.create_task(client._watch())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return [*lost, client.reachable]


async def test_a_recreated_controller_keeps_the_gateway(monkeypatch: Any) -> None:
    monkeypatch.setattr(controller_client, "RECONNECT_SECONDS", 0.01)
    assert await _run(alive=False, reconnects=True, seconds=1.0) == [True]
    assert await _run(alive=True, reconnects=False, seconds=0.5) == [True]


async def test_a_cluster_that_stays_gone_stops_the_gateway_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(controller_client, "RECONNECT_SECONDS", 0.01)
    assert await _run(alive=False, reconnects=False, seconds=1.0) == ["lost", False]


async def test_not_ready_from_the_first_failed_watch(monkeypatch: Any) -> None:
    """/ready turns 503 when the watch fails, not after the reconnect pause: in that pause a head
    restart's dead replicas were still advertised as ready (make test-image saw a 503 answer)."""
    monkeypatch.setattr(controller_client, "RECONNECT_SECONDS", 30.0)
    controller = FakeController(alive=False)
    client = ControllerClient(lambda: controller, lost_after=60)
    client._controller = controller
    task = asyncio.create_task(client._watch())
    await asyncio.sleep(0.2)  # the watch has failed; the reconnect pause has 29.8 s to go
    reachable = client.reachable
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert reachable is False
