"""backends/cluster/routing/router.py: least-loaded choice with a rotating tiebreak, the retry on another
replica when one is draining before the first token, and no retry when one dies holding the
request (issue #12: a poison request must not crash every replica), and backpressure on the Ray
stream. The replicas are fakes shaped like Ray actor handles (tests/support/fake_replicas.py);
Ray itself is never started."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

from raygate.backends.cluster.routing.replica import ReplicaDrainingError
from raygate.backends.cluster.routing.route_table import DeploymentRoute, ReplicaRoute
from raygate.backends.cluster.routing.router import UNREAD_BATCHES, ModelRouter, Replica
from raygate.backends.cluster.runtime.errors import ReplicaDiedError
from raygate.protocol.errors import EngineError, ServiceUnavailableError
from raygate.protocol.generation import (
    ChatMessage,
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    SamplingParams,
)
from raygate.protocol.policies import AutoscalingConfig
from tests.support.fake_replicas import CONFIG, FakeActor, collect, deltas

REQUEST = GenerateRequest(request_id="r1", sampling=SamplingParams(), prompt="hi")


def task_error(cause: BaseException) -> RayTaskError:
    """What Ray raises in the caller when the actor's method raised `cause`."""
    return RayTaskError("generate", "Traceback (most recent call last): ...", cause)


def died() -> RayActorError:
    return RayActorError()


def router(*actors: FakeActor) -> ModelRouter:
    return ModelRouter(CONFIG, [Replica(actor=a, id=a.name) for a in actors])


# ---- choice ------------------------------------------------------------------------------------


def test_pick_takes_the_least_loaded_replica() -> None:
    r = router(FakeActor("a"), FakeActor("b"), FakeActor("c"))
    for rep, load in zip(r.replicas, (2, 0, 1), strict=True):
        rep.inflight = load
    assert {r._pick(set()).id for _ in range(5)} == {"b"}


def test_ties_rotate_over_the_equally_loaded() -> None:
    r = router(FakeActor("a"), FakeActor("b"), FakeActor("c"))
    r.replicas[2].inflight = 1
    picks = [r._pick(set()).id for _ in range(6)]
    assert sorted(picks) == ["a", "a", "a", "b", "b", "b"]
    assert picks[0] != picks[1]  # alternates rather than sticking to one


def test_batch_lines_are_load_only_for_batch_lines() -> None:
    """An engine gives a batch line's slot to an interactive request that needs it: interactive
    requests spread by the interactive load (then the total), batch lines by the total."""
    r = router(FakeActor("a"), FakeActor("b"))
    a, b = r.replicas
    a.inflight, a.background = 3, 2  # 1 interactive + 2 batch lines
    b.inflight, b.background = 2, 0  # 2 interactive
    assert {r._pick(set()).id for _ in range(4)} == {"a"}
    assert {r._pick(set(), background=True).id for _ in range(4)} == {"b"}
    b.inflight = 1  # 1 interactive on each: the one with fewer batch lines to preempt
    assert {r._pick(set()).id for _ in range(4)} == {"b"}


def test_pick_skips_replicas_already_tried() -> None:
    r = router(FakeActor("a"), FakeActor("b"))
    r.replicas[1].inflight = 5
    assert r._pick({"a"}).id == "b"
    with pytest.raises(ServiceUnavailableError, match="no ready replica"):
        r._pick({"a", "b"})


def test_no_replicas_is_503() -> None:
    r = router()
    assert r.state == "loading"
    with pytest.raises(ServiceUnavailableError):
        r._pick(set())


def test_update_keeps_known_replicas_and_their_counts() -> None:
    a, b, c = FakeActor("a"), FakeActor("b"), FakeActor("c")
    r = router(a, b)
    kept = r.replicas[0]
    kept.inflight = 3
    r.update(
        DeploymentRoute(
            spec=CONFIG,
            state="ready",
            error=None,
            replicas=[ReplicaRoute("a", a, "node-1", 4096), ReplicaRoute("c", c, "node-2", 2048)],
            restarts=1,
        )
    )
    assert [x.id for x in r.replicas] == ["a", "c"]
    assert r.replicas[0] is kept
    assert kept.inflight == 3
    assert (kept.node_id, kept.context_length) == ("node-1", 4096)
    assert r.restarts == 1
    assert r._pick(set()).id == "c"


# ---- generate ----------------------------------------------------------------------------------


async def test_generate_streams_every_delta_and_asks_for_a_streaming_call() -> None:
    a = FakeActor("a", [deltas("he", "l", finish=False), deltas("lo")])
    r = router(a)
    out = await collect(r.generate(REQUEST))
    assert [d.text for d in out] == ["he", "l", "lo"]
    assert out[-1].finish_reason == "stop"
    assert a.generate.options_seen == [
        {"num_returns": "streaming", "_generator_backpressure_num_objects": UNREAD_BATCHES}
    ]
    assert r.replicas[0].inflight == 0


async def test_generate_stops_at_the_finishing_delta_without_draining_the_stream() -> None:
    a = FakeActor("a", [deltas("x"), deltas("never")])
    out = await collect(router(a).generate(REQUEST))
    assert [d.text for d in out] == ["x"]
    assert a.streams[0].pulled == 1


@pytest.mark.parametrize("background", [False, True])
async def test_inflight_counts_while_streaming(background: bool) -> None:
    a = FakeActor("a", [deltas("x", finish=False), deltas("y")])
    r = router(a)
    it = r.generate(dataclasses.replace(REQUEST, background=background))
    await anext(it)
    assert (r.replicas[0].inflight, r.replicas[0].background) == (1, int(background))
    assert [d.text async for d in it] == ["y"]
    assert (r.replicas[0].inflight, r.replicas[0].background) == (0, 0)


@pytest.mark.parametrize(
    "error",
    [task_error(ReplicaDrainingError("draining")), task_error(died())],
    ids=["draining", "died-inside-task"],
)
async def test_generate_retries_on_another_replica_before_the_first_token(error: BaseException) -> None:
    bad = FakeActor("bad", fail_at=0, error=error)
    good = FakeActor("good", [deltas("ok")])
    r = router(bad, good)
    r.replicas[1].inflight = 1  # the broken one is the least loaded: it is tried first
    out = await collect(r.generate(REQUEST))
    assert [d.text for d in out] == ["ok"]
    assert len(bad.streams) == 1
    assert len(good.streams) == 1
    assert [x.inflight for x in r.replicas] == [0, 1]


async def test_a_replica_that_dies_holding_the_request_fails_it_once_without_retrying() -> None:
    """Changed in issue #12 (the `actor-died` case above used to be retried): a request whose
    replica died before its first token may be what killed it, so it fails once."""
    bad = FakeActor("bad", fail_at=0, error=died())
    good = FakeActor("good", [deltas("ok")])
    r = router(bad, good)
    r.replicas[1].inflight = 1  # the dying one is the least loaded: it is tried first
    with pytest.raises(ReplicaDiedError, match="died while handling it") as caught:
        await collect(r.generate(REQUEST))
    assert (caught.value.status_code, caught.value.code) == (503, "replica_died")
    assert len(bad.streams) == 1
    assert good.streams == []  # the other replica never saw the request
    assert [x.inflight for x in r.replicas] == [0, 1]
    # and the dead replica gets nothing more until the controller's table drops it
    assert r.replicas[0].dead
    out = await collect(r.generate(REQUEST))
    assert [d.text for d in out] == ["ok"]
    assert (len(bad.streams), len(good.streams)) == (1, 1)


async def test_a_dead_replica_stays_out_of_routing_across_table_updates() -> None:
    a, b = FakeActor("a"), FakeActor("b")
    r = router(a, b)
    r.replicas[0].dead = True
    r.update(
        DeploymentRoute(
            spec=CONFIG,
            state="ready",
            error=None,
            replicas=[ReplicaRoute("a", a, "n", 1), ReplicaRoute("b", b, "n", 1)],
            restarts=0,
        )
    )
    assert {r._pick(set()).id for _ in range(4)} == {"b"}
    r.replicas[1].dead = True
    with pytest.raises(ServiceUnavailableError, match="no ready replica"):
        r._pick(set())


async def test_embed_on_a_replica_that_dies_is_not_retried() -> None:
    bad = FakeActor("bad", error=died())
    good = FakeActor("good")
    r = router(bad, good)
    r.replicas[1].inflight = 1
    with pytest.raises(ReplicaDiedError):
        await r.embed(EmbedRequest(request_id="e", inputs=["x"]))
    assert (bad.embeds, good.embeds) == (1, 0)


async def test_generate_gives_503_when_every_replica_refuses() -> None:
    error = task_error(ReplicaDrainingError("draining"))
    a, b = FakeActor("a", fail_at=0, error=error), FakeActor("b", fail_at=0, error=error)
    r = router(a, b)
    with pytest.raises(ServiceUnavailableError):
        await collect(r.generate(REQUEST))
    assert (len(a.streams), len(b.streams)) == (1, 1)  # each tried once, no loop
    assert [x.inflight for x in r.replicas] == [0, 0]


async def test_no_retry_once_a_token_went_out() -> None:
    a = FakeActor("a", [deltas("partial", finish=False)], fail_at=1, error=task_error(died()))
    b = FakeActor("b", [deltas("other")])
    r = router(a, b)
    r.replicas[1].inflight = 1
    it = r.generate(REQUEST)
    assert (await anext(it)).text == "partial"
    with pytest.raises(ServiceUnavailableError):
        await anext(it)
    assert b.streams == []
    assert r.replicas[0].inflight == 0


async def test_engine_errors_are_not_retried() -> None:
    a = FakeActor("a", fail_at=0, error=task_error(ValueError("bad grammar")))
    b = FakeActor("b", [deltas("other")])
    r = router(a, b)
    r.replicas[1].inflight = 1
    with pytest.raises(EngineError, match="bad grammar"):
        await collect(r.generate(REQUEST))
    assert b.streams == []


async def test_closing_the_stream_early_cancels_the_ray_call(monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled: list[Any] = []
    monkeypatch.setattr("ray.cancel", cancelled.append)
    a = FakeActor("a", [deltas("x", finish=False), deltas("y")])
    r = router(a)
    it = r.generate(REQUEST)
    assert isinstance(it, AsyncGenerator)
    await anext(it)
    await it.aclose()  # the client went away
    assert cancelled == [a.streams[0]]
    assert r.replicas[0].inflight == 0


async def test_finished_streams_are_not_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled: list[Any] = []
    monkeypatch.setattr("ray.cancel", cancelled.append)
    await collect(router(FakeActor("a", [deltas("x")])).generate(REQUEST))
    assert cancelled == []


# ---- embed -------------------------------------------------------------------------------------


async def test_embed_retries_on_a_draining_replica() -> None:
    bad = FakeActor("bad", error=task_error(ReplicaDrainingError("draining")))
    good = FakeActor("good")
    r = router(bad, good)
    r.replicas[1].inflight = 1
    result = await r.embed(EmbedRequest(request_id="e", inputs=["x"]))
    assert result.embeddings == [[1.0]]
    assert (bad.embeds, good.embeds) == (1, 1)
    assert [x.inflight for x in r.replicas] == [0, 1]


async def test_embed_on_a_replica_the_controller_just_stopped_goes_to_another() -> None:
    """Issue 51: this gateway's table still listed a replica the controller had drained and
    `ray.kill`ed; the call met a dead actor, though the request ran nowhere."""
    context = ActorDiedErrorContext(
        error_message="The actor is dead because it was killed by `ray.kill`.", actor_id=b"\1" * 16
    )
    bad = FakeActor("bad", error=ActorDiedError(context))
    good = FakeActor("good")
    r = router(bad, good)
    r.replicas[1].inflight = 1
    result = await r.embed(EmbedRequest(request_id="e", inputs=["x"]))
    assert result.embeddings == [[1.0]]
    assert (bad.embeds, good.embeds) == (1, 1)
    assert r.replicas[0].dead  # and nothing more goes there


async def test_embed_engine_error_is_not_retried() -> None:
    bad = FakeActor("bad", error=task_error(ValueError("too long")))
    good = FakeActor("good")
    r = router(bad, good)
    r.replicas[1].inflight = 1
    with pytest.raises(EngineError):
        await r.embed(EmbedRequest(request_id="e", inputs=["x"]))
    assert good.embeds == 0


async def test_concurrent_requests_spread_over_replicas() -> None:
    gate = asyncio.Event()

    async def slow(request: EmbedRequest) -> EmbedResult:
        await gate.wait()
        return EmbedResult(embeddings=[[0.0]], prompt_tokens=1)

    a, b = FakeActor("a", embed=slow), FakeActor("b", embed=slow)
    r = router(a, b)
    calls = [asyncio.create_task(r.embed(EmbedRequest(request_id=str(i), inputs=["x"]))) for i in range(4)]
    await asyncio.sleep(0)
    assert [x.inflight for x in r.replicas] == [2, 2]
    gate.set()
    await asyncio.gather(*calls)
    assert (a.embeds, b.embeds) == (2, 2)


# ---- prefix affinity and scale from zero ---------------------------------------------------------

SYSTEM = "You answer in one word. " * 30  # ~700 characters: two whole prefix blocks


def chat(user: str) -> GenerateRequest:
    messages = [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=user)]
    return GenerateRequest(request_id="r", sampling=SamplingParams(), messages=messages)


def affinity_router(*actors: FakeActor, imbalance: int = 1) -> ModelRouter:
    config = CONFIG.model_copy(
        update={
            "routing": CONFIG.routing.model_copy(
                update={"policy": "prefix_affinity", "max_imbalance": imbalance}
            )
        }
    )
    return ModelRouter(config, [Replica(actor=a, id=a.name) for a in actors])


def test_affinity_sends_a_known_prefix_back_within_the_imbalance_bound() -> None:
    r = affinity_router(FakeActor("a"), FakeActor("b"))
    first = r._pick(set(), r._keys(chat("q1")))
    assert (r.affinity.miss, r.affinity.hit) == (1, 0)
    first.inflight = 1  # busier than the other by 1: still within the bound
    assert r._pick(set(), r._keys(chat("q2"))).id == first.id  # same system prompt
    assert r.affinity.hit == 1
    first.inflight = 3  # 3 above the least-loaded: fall back
    other = r._pick(set(), r._keys(chat("q3")))
    assert other.id != first.id and r.affinity.fallback == 1


def test_affinity_is_the_default_and_skips_a_lone_fixed_replica() -> None:
    assert CONFIG.routing.policy == "prefix_affinity"
    one = ModelRouter(CONFIG, [Replica(actor=FakeActor("a"), id="a")])
    assert one._keys(chat("q")) is None  # nothing to choose between, nothing worth remembering
    two = ModelRouter(CONFIG, [Replica(actor=a, id=a.name) for a in (FakeActor("a"), FakeActor("b"))])
    assert two._keys(chat("q"))
    # An autoscaled model may grow: its prefixes are remembered from the first request.
    scaled = CONFIG.model_copy(update={"autoscaling": AutoscalingConfig(min_replicas=0, max_replicas=2)})
    assert ModelRouter(scaled, [])._keys(chat("q"))


def test_least_loaded_policy_computes_no_prefix() -> None:
    routing = CONFIG.routing.model_copy(update={"policy": "least_loaded"})
    assert ModelRouter(CONFIG.model_copy(update={"routing": routing}), [])._keys(chat("q")) is None


async def test_an_autoscaled_model_at_zero_waits_for_a_replica() -> None:
    config = CONFIG.model_copy(update={"autoscaling": AutoscalingConfig(min_replicas=0, max_replicas=2)})
    r = ModelRouter(config, [])
    asked: list[int] = []
    r.on_demand = lambda: asked.append(1)
    r.state = "ready"
    assert r.servable()
    a = FakeActor("a", [[Delta("x", 1, 1, "stop")]])
    task = asyncio.create_task(
        collect(r.generate(GenerateRequest(request_id="r", sampling=SamplingParams())))
    )
    await asyncio.sleep(0.05)
    assert not task.done() and asked and r.waiting == 1 and r.ongoing == 1
    r.update(DeploymentRoute(config, "ready", None, [ReplicaRoute("a", a, "n", 100)], desired=1))
    deltas = await asyncio.wait_for(task, 5)
    assert [d.text for d in deltas] == ["x"] and r.waiting == 0 and r.ongoing == 0


async def test_at_zero_with_no_room_for_a_replica_is_503_with_retry_after() -> None:
    config = CONFIG.model_copy(update={"autoscaling": AutoscalingConfig(min_replicas=0, max_replicas=2)})
    r = ModelRouter(config, [])
    r.update(DeploymentRoute(config, "ready", None, [], no_room="no node has room"))
    with pytest.raises(ServiceUnavailableError) as err:
        await collect(r.generate(GenerateRequest(request_id="r", sampling=SamplingParams())))
    assert err.value.headers() and "no node has room" in err.value.message and r.ongoing == 0


def test_a_bounded_model_sends_an_adapter_where_it_went_last() -> None:
    """`lora.max_loras`: replicas hold their latest adapters only, so a request for an adapter goes
    to the replica this gateway last sent it to (not too loaded), another adapter elsewhere."""
    config = CONFIG.model_copy(update={"lora": CONFIG.lora.model_copy(update={"max_loras": 1})})
    r = ModelRouter(config, [Replica(actor=FakeActor(n), id=n) for n in ("a", "b", "c")])

    def lora(name: str) -> tuple[str, ...]:
        req = GenerateRequest(request_id="x", sampling=SamplingParams(), prompt="hi", lora=((name, 1.0),))
        return r._adapters(req)

    first = r._pick(set(), None, lora("ad-1"))
    assert all(r._pick(set(), None, lora("ad-1")).id == first.id for _ in range(4))
    other = r._pick(set(), None, lora("ad-2"))
    assert other.id != first.id  # ad-2 goes least-loaded (ties rotate), then sticks there
    assert r._pick(set(), None, lora("ad-2")).id == other.id
    first.inflight = 5  # too loaded: least-loaded decides
    assert r._pick(set(), None, lora("ad-1")).id != first.id
    zero = GenerateRequest(request_id="z", sampling=SamplingParams(), prompt="hi", lora=(("ad-1", 0.0),))
    assert r._adapters(zero) == ()  # at scale 0 the adapter is not applied: no preference
