"""The controller's autoscaling pass, without Ray: what the cluster has room for is monkeypatched,
and the replica actors are recorded, not started (they never need to load for what is tested)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

import raygate.backends.cluster.control.controller as controller_module
from raygate.backends.cluster.control.controller import Controller
from raygate.protocol.config import ModelConfig

SPEC = ModelConfig.model_validate(
    {
        "name": "side-embed",
        "task": "embed",
        "source": {"path": "/nowhere/model.gguf"},
        "resources": {"side": 1},
        "autoscaling": {"min_replicas": 0, "max_replicas": 1},
    }
)


class RecordedActors:
    """Stands in for `RayActors`: records the replicas the controller starts."""

    started: ClassVar[list[int]] = []

    def __init__(self, reserved: Any = None) -> None:
        pass

    def start(self, spec: ModelConfig, seq: int) -> object:
        RecordedActors.started.append(seq)
        return object()

    def kill(self, actor: object) -> None:
        pass

    async def check_feasible(self, spec: ModelConfig) -> str | None:
        return None


@pytest.fixture
async def controller(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Controller, list[int]]]:
    room = [0]

    async def room_for(spec: ModelConfig) -> int:
        return room[0]

    RecordedActors.started = []
    monkeypatch.setattr(controller_module, "room_for", room_for)
    monkeypatch.setattr(controller_module, "RayActors", RecordedActors)
    ctl = Controller(None, [SPEC])
    ctl._boot()
    assert ctl._autoscaling is not None
    ctl._autoscaling.cancel()  # the test runs the passes itself
    yield ctl, room
    for d in ctl._deployments.values():
        for task in list(d._tasks):
            task.cancel()


async def test_no_room_at_zero_clears_once_nothing_waits_so_the_next_request_scales_up(
    controller: tuple[Controller, list[int]],
) -> None:
    """The chaos hour's 503s: a request came while the side node was down (no room); the gateways
    then refused every request at once with the route's `no_room` and reported no load, so the
    controller never looked again and the model stayed at zero after the node was back."""
    ctl, room = controller
    deployment = ctl._deployments[SPEC.name]
    assert deployment.target == 0

    await ctl.report_load("gw", {SPEC.name: 1.0})  # a request waits; the node is down
    await ctl._autoscale_once()
    assert deployment.target == 0 and "0 free slots" in (deployment.no_room or "")
    assert ctl._table().deployments[0].no_room == deployment.no_room  # what gateways refuse with

    room[0] = 1  # the node is back; the refused request is gone, nothing waits
    await ctl.report_load("gw", {SPEC.name: 0.0})
    await ctl._autoscale_once()
    assert deployment.no_room is None and ctl._table().deployments[0].no_room is None

    await ctl.report_load("gw", {SPEC.name: 1.0})  # so the next request waits, and is served
    await ctl._autoscale_once()
    assert deployment.target == 1 and RecordedActors.started == [1]
