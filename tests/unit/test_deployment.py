"""backends/cluster/control/deployment.py: the replica state machine, run on fake actors (with its restart
budget, restart_budget.py, and the actor seam's `describe_failure`, replica_actors.py).

loading -> ready; death -> replaced while restarts are left (and a node can host it), then
failed; scale down drains the removed replicas; an update rolls a full new set and drains the old
one only once the new one is ready. `Deployment` takes the actor operations as an argument, so the
fake below stands in for Ray: each replica's `start` / `watch` / `drain` is a future the test
resolves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from ray.exceptions import RayActorError, RayTaskError

import raygate.backends.cluster.control.deployment as deployment_module
import raygate.backends.cluster.control.replica_actors as replica_actors_module
import raygate.backends.cluster.control.restart_budget as restart_budget_module
from raygate.backends.cluster.control.deployment import Deployment
from raygate.backends.cluster.control.replica_actors import describe_failure
from raygate.protocol.config import ModelConfig


class FakeReplica:
    """One fake actor. `start.remote()` resolves when the test calls `ready()`/`fail_load()`,
    `watch.remote()` never returns until `die()`, `drain.remote(t)` answers `drain_result`."""

    def __init__(self, spec: ModelConfig, seq: int) -> None:
        self.spec, self.seq = spec, seq
        loop = asyncio.get_running_loop()
        self.loaded: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.dead: asyncio.Future[None] = loop.create_future()
        self.drain_result = True
        self.drained_with: list[float] = []
        self.killed = False
        self.start = _Method(self._start)
        self.watch = _Method(self._watch)
        self.drain = _Method(self._drain)

    async def _start(self) -> dict[str, Any]:
        return await asyncio.shield(self.loaded)

    async def _watch(self) -> None:
        await asyncio.shield(self.dead)

    async def _drain(self, timeout: float) -> bool:
        self.drained_with.append(timeout)
        return self.drain_result

    def ready(self, node: str = "node-a", context_length: int = 2048) -> None:
        self.loaded.set_result({"node_id": node, "context_length": context_length})

    def fail_load(self, exc: BaseException) -> None:
        self.loaded.set_exception(exc)

    def die(self, exc: BaseException | None = None) -> None:
        self.dead.set_exception(exc or RayActorError())


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        return self._fn(*args)


class FakeActors:
    """The `RayActors` stand-in: records what was started and killed; `infeasible` is what the
    placement check answers (None: some node can host a replica)."""

    def __init__(self) -> None:
        self.started: list[FakeReplica] = []
        self.infeasible: str | None = None

    def start(self, spec: ModelConfig, seq: int) -> FakeReplica:
        replica = FakeReplica(spec, seq)
        self.started.append(replica)
        return replica

    def kill(self, actor: FakeReplica) -> None:
        actor.killed = True

    async def check_feasible(self, spec: ModelConfig) -> str | None:
        return self.infeasible


class Changes(list[bool]):
    """The deployment's `on_change` calls; `peek`, if set, runs at each (to see the state then)."""

    peek: Callable[[bool], None] | None = None

    def __call__(self, spec_changed: bool) -> None:
        self.append(spec_changed)
        if self.peek is not None:
            self.peek(spec_changed)


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_actors_module, "PLACEMENT_CHECK_SECONDS", 0.01)
    monkeypatch.setattr(deployment_module, "UPDATE_POLL_SECONDS", 0.005)


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., tuple[Deployment, FakeActors, Changes]]]:
    made: list[Deployment] = []

    def factory(**spec: Any) -> tuple[Deployment, FakeActors, Changes]:
        actors, changes = FakeActors(), Changes()
        dep = Deployment(ModelConfig(**{"name": "m", "backend": "synthetic", **spec}), changes, actors)
        made.append(dep)
        return dep, actors, changes

    yield factory
    for dep in made:  # cancel what still watches or waits, so no task outlives its test
        await dep.undeploy(0.01)


async def settle(until: Callable[[], bool] | None = None, rounds: int = 200) -> None:
    """Let the deployment's background tasks run (until `until()` holds, if given)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
        if until is not None and until():
            return
    if until is not None:
        for _ in range(100):  # timers (the update's poll) need real time
            await asyncio.sleep(0.005)
            if until():
                return
        raise AssertionError("condition not reached")


def states(dep: Deployment) -> list[str]:
    return [r.state for r in dep.replicas]


# ---- load ---------------------------------------------------------------------------------------


async def test_loading_then_ready(make: Any) -> None:
    dep, actors, changes = make(replicas=2)
    dep.reconcile()
    assert states(dep) == ["loading", "loading"]
    assert dep.state == "loading"
    assert dep.route().replicas == []
    assert [r.id for r in dep.replicas] == ["m#1", "m#2"]

    actors.started[0].ready(node="node-a", context_length=4096)
    await settle(lambda: dep.count("ready") == 1)
    assert dep.state == "loading"  # one still loading
    actors.started[1].ready(node="node-b")
    await settle(lambda: dep.state == "ready")

    route = dep.route()
    assert [(r.id, r.node_id, r.context_length) for r in route.replicas] == [
        ("m#1", "node-a", 4096),
        ("m#2", "node-b", 2048),
    ]
    status = dep.status()
    assert (status.ready, status.desired, status.restarts, status.error) == (2, 2, 0, None)
    assert True not in changes  # nothing here changes the persisted spec


async def test_reconcile_is_idempotent(make: Any) -> None:
    dep, actors, _ = make(replicas=2)
    dep.reconcile()
    dep.reconcile()
    assert len(actors.started) == 2


async def test_engine_load_error_fails_without_retrying(make: Any) -> None:
    dep, actors, _ = make()
    dep.reconcile()
    actors.started[0].fail_load(RayTaskError("start", "tb", ValueError("no such file: x.gguf")))
    await settle(lambda: dep.state == "failed")
    assert len(actors.started) == 1  # an engine error would fail the same way again
    assert actors.started[0].killed
    rec = dep.replicas[0]
    assert rec.error == "could not load: ValueError: no such file: x.gguf"
    assert dep.error == "replica m#1 could not load: ValueError: no such file: x.gguf"
    assert dep.restarts == 0


async def test_actor_death_while_loading_is_replaced(make: Any) -> None:
    dep, actors, _ = make()
    dep.reconcile()
    actors.started[0].fail_load(RayActorError())
    await settle(lambda: len(actors.started) == 2)
    assert dep.restarts == 1
    assert [r.id for r in dep.replicas] == ["m#2"]
    actors.started[1].ready()
    await settle(lambda: dep.state == "ready")


async def test_load_gives_up_when_no_node_can_host_the_replica(make: Any) -> None:
    dep, actors, _ = make()
    dep.reconcile()
    actors.infeasible = "no alive node offers GPU"
    await settle(lambda: dep.state == "failed")
    assert dep.replicas[0].error == "could not load: cannot be placed: no alive node offers GPU"
    assert actors.started[0].killed
    assert len(actors.started) == 1


# ---- death --------------------------------------------------------------------------------------


async def test_dead_replica_is_replaced_until_max_restarts_then_failed(make: Any) -> None:
    dep, actors, _ = make(max_restarts=2)
    dep.reconcile()
    for i in range(3):
        actors.started[i].ready()
        await settle(lambda: dep.state == "ready")
        actors.started[i].die()
        await settle(lambda: dep.state != "ready")
        await settle()
        assert actors.started[i].killed
    # two replacements were made; the third death is the end
    assert len(actors.started) == 3
    assert dep.restarts == 2
    assert dep.state == "failed"
    assert states(dep) == ["failed"]
    assert dep.replicas[0].id == "m#3"
    assert "not replaced: max_restarts=2 reached" in (dep.error or "")


async def test_replacement_message_counts_restarts(make: Any) -> None:
    dep, actors, _ = make(max_restarts=3)
    dep.reconcile()
    actors.started[0].ready()
    await settle(lambda: dep.state == "ready")
    actors.started[0].die()
    await settle(lambda: len(actors.started) == 2)
    assert dep.error is not None
    assert dep.error.startswith("replica m#1 died: ")
    # the budget is a rate now (issue #12): the message says over which window it counts
    assert dep.error.endswith("replaced (1/3 restarts used within 600s)")
    assert states(dep) == ["loading"]
    assert dep.state == "loading"


class Clock:
    """`time.monotonic` as the restart budget sees it, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_restart_budget_is_a_rate_isolated_crashes_never_use_it_up(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #12: a lifetime count left a model `failed` for good after a few isolated crashes
    (one poison request each). Restarts older than the window no longer count."""
    clock = Clock()
    monkeypatch.setattr(restart_budget_module, "restart_clock", clock)
    dep, actors, _ = make(max_restarts=1)
    dep.reconcile()
    for i in range(4):  # four crashes, each more than a window after the previous restart
        actors.started[i].ready()
        await settle(lambda: dep.state == "ready")
        clock.now += restart_budget_module.RESTART_WINDOW_SECONDS + 1
        actors.started[i].die()
        await settle(lambda i=i: len(actors.started) == i + 2)
        assert dep.restarts == 1  # only the one just made is within the window
    assert dep.state == "loading"
    assert "1/1 restarts used within 600s" in (dep.error or "")


async def test_a_replica_refused_for_the_budget_is_replaced_once_the_window_allows(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(restart_budget_module, "restart_clock", clock)
    monkeypatch.setattr(restart_budget_module, "RESTART_WINDOW_SECONDS", 0.3)
    dep, actors, _ = make(max_restarts=1)
    dep.reconcile()
    actors.started[0].ready()
    await settle(lambda: dep.state == "ready")
    actors.started[0].die()
    await settle(lambda: len(actors.started) == 2)  # the one restart the window allows
    actors.started[1].ready()
    await settle(lambda: dep.state == "ready")
    clock.now += 0.1
    actors.started[1].die()  # a second crash inside the window: refused for now
    await settle(lambda: "not replaced" in (dep.error or ""))
    assert dep.state == "failed"
    assert "max_restarts=1 reached within 0.3s; next try in 0s" in (dep.error or "")
    assert len(actors.started) == 2
    clock.now += 0.3  # the first restart leaves the window: the waiting replacement goes ahead
    await settle(lambda: len(actors.started) == 3)
    assert [r.id for r in dep.replicas] == ["m#3"]
    actors.started[2].ready()
    await settle(lambda: dep.state == "ready")


async def test_max_restarts_zero_never_replaces_and_never_schedules_a_retry(make: Any) -> None:
    dep, actors, _ = make(max_restarts=0)
    dep.reconcile()
    actors.started[0].ready()
    await settle(lambda: dep.state == "ready")
    actors.started[0].die()
    await settle(lambda: "not replaced" in (dep.error or ""))
    assert "max_restarts=0 reached" in (dep.error or "")
    assert "next try" not in (dep.error or "")
    assert len(actors.started) == 1


async def test_dead_replica_is_not_replaced_when_nothing_can_host_it(make: Any) -> None:
    dep, actors, _ = make(replicas=2)
    dep.reconcile()
    for a in actors.started:
        a.ready()
    await settle(lambda: dep.state == "ready")
    actors.infeasible = "the node died"
    actors.started[1].die()
    await settle(lambda: "not replaced" in (dep.error or ""))
    assert len(actors.started) == 2
    assert states(dep) == ["ready", "failed"]
    assert dep.state == "degraded"
    assert dep.restarts == 0
    assert [r.id for r in dep.route().replicas] == ["m#1"]


async def test_a_replica_with_no_room_is_replaced_once_a_node_can_host_it(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node killed and brought back (`make chaos`): its replicas come back with it."""
    monkeypatch.setattr(deployment_module, "NO_ROOM_RETRY_SECONDS", 0.01)
    dep, actors, _ = make(replicas=2)
    dep.reconcile()
    for a in actors.started:
        a.ready()
    await settle(lambda: dep.state == "ready")
    actors.infeasible = "no alive node offers {'side': 1.0}"
    actors.started[1].die()
    await settle(lambda: "not replaced" in (dep.error or ""))
    assert "looking again every 0.01s" in (dep.error or "")
    await asyncio.sleep(0.05)  # several looks, while the cluster still has no room
    assert len(actors.started) == 2 and dep.state == "degraded"
    actors.infeasible = None  # the node is back
    await settle(lambda: len(actors.started) == 3)
    actors.started[2].ready()
    await settle(lambda: dep.state == "ready")
    assert dep.restarts == 1


# ---- scale ----------------------------------------------------------------------------------------


async def test_scale_down_drains_the_newest_ready_replicas(make: Any) -> None:
    dep, actors, changes = make(replicas=3)
    dep.reconcile()
    for a in actors.started:
        a.ready()
    await settle(lambda: dep.state == "ready")
    changes.clear()

    dep.scale(1, drain_timeout=7.0)
    # Out of routing at once: the status returned to the caller already says so.
    assert states(dep) == ["ready", "draining", "draining"]
    assert [r.id for r in dep.route().replicas] == ["m#1"]
    assert dep.spec.replicas == 1
    assert True in changes  # the new replica count is persisted
    await settle(lambda: len(dep.replicas) == 1)
    assert [a.drained_with for a in actors.started] == [[], [7.0], [7.0]]
    assert [a.killed for a in actors.started] == [False, True, True]
    assert dep.state == "ready"
    assert len(actors.started) == 3  # nothing new was started


async def test_scale_down_removes_loading_replicas_first(make: Any) -> None:
    dep, actors, _ = make(replicas=3)
    dep.reconcile()
    actors.started[0].ready()
    actors.started[2].ready()
    await settle(lambda: dep.count("ready") == 2)
    dep.scale(2, drain_timeout=1.0)
    await settle(lambda: len(dep.replicas) == 2)
    assert [r.id for r in dep.replicas] == ["m#1", "m#3"]
    assert actors.started[1].killed
    assert actors.started[1].drained_with == []  # it served nothing: no drain
    assert dep.state == "ready"


async def test_scale_up_adds_replicas_and_resets_restarts(make: Any) -> None:
    dep, actors, _ = make(replicas=1)
    dep.reconcile()
    actors.started[0].fail_load(RayActorError())
    await settle(lambda: len(actors.started) == 2)
    assert dep.restarts == 1
    dep.scale(3, drain_timeout=1.0)
    assert dep.restarts == 0
    assert len(actors.started) == 4
    for a in actors.started[1:]:
        a.ready()
    await settle(lambda: dep.state == "ready")
    assert dep.count("ready") == 3


async def test_scale_forgets_failed_replicas(make: Any) -> None:
    dep, actors, _ = make(replicas=1)
    dep.reconcile()
    actors.started[0].fail_load(ValueError("bad"))
    await settle(lambda: dep.state == "failed")
    dep.scale(1, drain_timeout=1.0)
    assert [r.id for r in dep.replicas] == ["m#2"]
    assert states(dep) == ["loading"]


async def test_drain_timeout_reports_a_cut(make: Any) -> None:
    dep, actors, _ = make(replicas=2)
    dep.reconcile()
    for a in actors.started:
        a.ready()
    await settle(lambda: dep.state == "ready")
    actors.started[0].drain_result = False
    assert await dep.undeploy(5.0) is False
    assert all(a.killed for a in actors.started)
    assert dep.replicas == []


async def test_undeploy_drains_everything(make: Any) -> None:
    dep, actors, _ = make(replicas=2)
    dep.reconcile()
    actors.started[0].ready()
    await settle(lambda: dep.count("ready") == 1)
    assert await dep.undeploy(3.0) is True
    assert actors.started[0].drained_with == [3.0]
    assert actors.started[1].drained_with == []  # still loading: nothing to drain
    assert all(a.killed for a in actors.started)
    dep.reconcile()
    assert len(actors.started) == 2  # closed: nothing restarts


# ---- update ---------------------------------------------------------------------------------------


async def test_light_update_is_applied_in_place(make: Any) -> None:
    dep, actors, changes = make()
    dep.reconcile()
    actors.started[0].ready()
    await settle(lambda: dep.state == "ready")
    changes.clear()
    dep.update(dep.spec.model_copy(update={"aliases": ["other"], "max_restarts": 9}))
    assert (dep.spec.aliases, dep.spec.max_restarts) == (["other"], 9)
    assert changes == [True]
    assert len(actors.started) == 1
    assert not dep.updating


async def test_update_rolls_a_new_set_then_drains_the_old(make: Any) -> None:
    dep, actors, changes = make(replicas=2)
    dep.reconcile()
    for a in actors.started:
        a.ready()
    await settle(lambda: dep.state == "ready")
    changes.clear()

    routed_at_switch: list[list[str]] = []
    changes.peek = lambda spec_changed: (
        routed_at_switch.append([r.id for r in dep.route().replicas]) if spec_changed else None
    )
    new_spec = dep.spec.model_copy(update={"engine": {"seed": 1}})
    dep.update(new_spec)
    assert dep.updating
    await settle(lambda: len(actors.started) == 4)
    # The old set keeps serving while the new one loads.
    assert [r.id for r in dep.route().replicas] == ["m#1", "m#2"]
    assert dep.spec.engine == {}
    assert True not in changes  # the old spec stays the persisted one until the switch

    actors.started[2].ready()
    actors.started[3].ready()
    await settle(lambda: not dep.updating)
    assert dep.spec == new_spec
    # The switch is one change: the spec is persisted and the old set is out of routing at once.
    assert routed_at_switch == [["m#3", "m#4"]]
    await settle(lambda: len(dep.replicas) == 2)
    assert [r.id for r in dep.replicas] == ["m#3", "m#4"]
    assert [a.killed for a in actors.started] == [True, True, False, False]
    assert actors.started[0].drained_with == [deployment_module.UPDATE_DRAIN_SECONDS]
    assert dep.state == "ready"
    assert dep.error is None


async def test_failed_update_keeps_serving_the_old_spec(make: Any) -> None:
    dep, actors, _ = make(replicas=2)
    dep.reconcile()
    for a in actors.started:
        a.ready()
    await settle(lambda: dep.state == "ready")
    old_spec = dep.spec

    dep.update(old_spec.model_copy(update={"engine": {"broken": True}}))
    await settle(lambda: len(actors.started) == 4)
    actors.started[2].ready()
    actors.started[3].fail_load(ValueError("unknown engine argument `broken`"))
    await settle(lambda: not dep.updating)
    assert dep.spec == old_spec
    assert dep.error is not None
    assert dep.error.startswith("update failed, still serving the previous spec: replica m#4")
    await settle(lambda: len(dep.replicas) == 2)
    assert [r.id for r in dep.replicas] == ["m#1", "m#2"]
    assert [a.killed for a in actors.started] == [False, False, True, True]
    assert dep.state == "ready"


async def test_death_of_an_old_replica_during_an_update_is_replaced_in_the_old_spec(make: Any) -> None:
    dep, actors, _ = make(replicas=1)
    dep.reconcile()
    actors.started[0].ready()
    await settle(lambda: dep.state == "ready")
    dep.update(dep.spec.model_copy(update={"engine": {"seed": 2}}))
    await settle(lambda: len(actors.started) == 2)
    actors.started[0].die()
    await settle(lambda: len(actors.started) == 3)
    assert actors.started[2].spec.engine == {}  # the replacement serves the current spec
    actors.started[1].ready()
    await settle(lambda: not dep.updating)
    assert dep.spec.engine == {"seed": 2}


# ---- failure text ---------------------------------------------------------------------------------


def test_describe_failure_prefers_the_engine_error() -> None:
    exc = RayTaskError("start", "Traceback ...", FileNotFoundError("model.gguf"))
    assert describe_failure(exc) == "FileNotFoundError: model.gguf"


def test_describe_failure_drops_ray_identity_lines() -> None:
    exc = RuntimeError(
        "The actor died unexpectedly.\n"
        "\tclass_name: ModelWorker\n\tactor_id: abc123\n\tpid: 42\n"
        "The actor's worker process was killed by the OOM killer."
    )
    assert describe_failure(exc) == (
        "The actor died unexpectedly. The actor's worker process was killed by the OOM killer."
    )
    assert describe_failure(RuntimeError()) == "RuntimeError"
