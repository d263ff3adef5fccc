"""Pieces of issue 18 without Ray: the autoscaler's decisions over (fake) time, the cluster-wide
load sum, placement room, prefix keys and the prefix table, and the spec's validation."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from raygate.backends.cluster.control.autoscaler import STALE_SECONDS, Autoscaler, LoadReports
from raygate.backends.cluster.routing.affinity import PrefixTable, prefix_keys, prompt_text
from raygate.backends.cluster.runtime.placement import UNBOUNDED_SLOTS, free_slots, preferred_node
from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import ChatMessage, GenerateRequest, ImageInput, SamplingParams
from raygate.protocol.policies import AutoscalingConfig


def scaler(**kw: float) -> Autoscaler:
    base = {"min_replicas": 0, "max_replicas": 4, "target_ongoing_requests": 2}
    base.update({"upscale_delay_s": 1, "downscale_delay_s": 5, "downscale_to_zero_delay_s": 10})
    base.update(kw)
    return Autoscaler(AutoscalingConfig.model_validate(base))


def test_upscale_waits_for_its_delay_and_clamps_to_max() -> None:
    a = scaler()
    assert a.decide(1, 7, now=0.0) is None  # wants 4, but only since now
    assert a.decide(1, 7, now=0.5) is None
    d = a.decide(1, 7, now=1.0)
    assert d is not None and d.replicas == 4
    assert a.decide(4, 100, now=1.1) is None  # already at max_replicas


def test_a_turn_of_direction_restarts_the_clock() -> None:
    a = scaler()
    assert a.decide(2, 8, now=0.0) is None  # up
    assert a.decide(2, 0.5, now=0.9) is None  # now down: a new wish
    assert a.decide(2, 8, now=1.5) is None  # up again, since 1.5
    assert a.decide(2, 8, now=2.6) is not None


def test_down_to_one_then_zero_on_their_own_delays() -> None:
    a = scaler()
    assert a.decide(3, 0, now=0.0) is None
    d = a.decide(3, 0, now=5.0)
    assert d is not None and d.replicas == 1  # the last replica leaves on the to-zero delay
    assert a.decide(1, 0, now=5.1) is None
    assert a.decide(1, 0, now=14.0) is None
    d = a.decide(1, 0, now=15.1)
    assert d is not None and d.replicas == 0


def test_scale_from_zero_is_immediate_and_min_is_kept() -> None:
    d = scaler().decide(0, 1, now=0.0)
    assert d is not None and d.replicas == 1
    assert scaler(min_replicas=1).decide(1, 0, now=100.0) is None


def test_load_is_summed_over_fresh_gateway_reports() -> None:
    loads = LoadReports()
    loads.report("gw1", {"m": 3}, now=0.0)
    loads.report("gw2", {"m": 2, "other": 9}, now=1.0)
    assert loads.total("m", now=1.0) == 5
    assert loads.total("m", now=STALE_SECONDS + 0.5) == 2  # gw1 went quiet: no longer counted


def test_free_slots_counts_replicas_per_node() -> None:
    available = {"a": {"CPU": 2.0, "slot": 2.0}, "b": {"CPU": 1.0, "slot": 1.0}, "c": {"CPU": 8.0}}
    assert free_slots({"slot": 1.0}, available) == 3
    assert free_slots({"CPU": 1.0, "slot": 1.0}, available) == 3
    assert free_slots({"CPU": 1.5}, available) == 1 + 5
    assert free_slots({}, available) == UNBOUNDED_SLOTS


def _chat(*contents: str) -> GenerateRequest:
    messages = [ChatMessage(role="system" if i == 0 else "user", content=c) for i, c in enumerate(contents)]
    return GenerateRequest(request_id="r", sampling=SamplingParams(), messages=messages)


def _node(node_id: str, alive: bool = True, **resources: float) -> dict[str, object]:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": 2.0, **resources}}


def test_a_replica_without_custom_resources_prefers_nodes_that_offer_none_another_model_needs() -> None:
    nodes = [_node("head", main=4.0), _node("side", side=1.0), _node("gpu", gpu_box=1.0)]
    free = {"head": {"CPU": 0.5, "main": 4.0}, "side": {"CPU": 1.0, "side": 1.0}, "gpu": {"CPU": 2.0}}
    demand = {"CPU": 0.5}
    # `side` and `gpu_box` are requested by other models: the head, though it has the least CPU free.
    assert preferred_node(demand, {"side", "gpu_box"}, nodes, free) == "head"
    # Of several nodes free of reserved resources, the one with the most CPU free.
    assert preferred_node(demand, {"side"}, nodes, free) == "gpu"
    # The preferred nodes are full now (or dead): no preference, Ray places it.
    assert preferred_node({"CPU": 1.0}, {"side", "gpu_box"}, nodes, free) is None
    dead_head = [_node("head", alive=False, main=4.0), *nodes[1:]]
    assert preferred_node(demand, {"side", "gpu_box"}, dead_head, free) is None


def test_prefix_keys_share_the_common_blocks_only() -> None:
    system = "You are terse. " * 40  # 600 characters: two whole 256-character blocks
    one = prefix_keys(prompt_text(_chat(system, "first question")), 256, 64)
    two = prefix_keys(prompt_text(_chat(system, "another question")), 256, 64)
    assert one[:2] == two[:2] and len(one) == len(two) == 2
    longer = prefix_keys(prompt_text(_chat(system, "first question", "x" * 300)), 256, 64)
    assert longer[:2] == one and len(longer) == 3
    assert len(prefix_keys("y" * 10_000, 256, 4)) == 4
    assert prefix_keys("short", 256, 4) == [] and prefix_keys("", 256, 4) == []  # under one block


def test_prefix_keys_of_one_prompt_differ_by_lora_adapter() -> None:
    """A replica caches a prefix under one adapter set only: affinity must not send a request for
    adapter b to where the same prompt ran under adapter a (or under the base)."""
    base = _chat("You are terse. " * 40, "a question")
    keys = {
        lora: tuple(prefix_keys(prompt_text(dataclasses.replace(base, lora=lora)), 256, 64))
        for lora in [(), (("a", 1.0),), (("b", 1.0),), (("a", 0.5),)]
    }
    assert len(set(keys.values())) == 4 and all(keys.values())


def _image(digest: str) -> ImageInput:
    return ImageInput(data=b"", digest=digest, width=1, height=1, format="PNG")


def _look(*parts: str | ImageInput) -> GenerateRequest:
    texts = "".join(p for p in parts if isinstance(p, str))
    messages = [ChatMessage(role="user", content=texts, parts=parts)]
    return GenerateRequest(request_id="r", sampling=SamplingParams(), messages=messages)


def test_prefix_keys_cover_the_images_by_digest() -> None:
    """The same image (by digest) makes the same keys, so it goes where the engine cached it, even
    with a short question after it; another image, or the same one elsewhere, does not."""
    red, blue = _image("a" * 64), _image("b" * 64)
    one = prefix_keys(prompt_text(_look(red, "What is this?")), 256, 64)
    again = prefix_keys(prompt_text(_look(red, "And the colour?")), 256, 64)
    other = prefix_keys(prompt_text(_look(blue, "What is this?")), 256, 64)
    later = prefix_keys(prompt_text(_look("What is this?", red)), 256, 64)
    assert one and one[:3] == again[:3]  # a whole ~1 KB of the image before the text differs
    assert not set(one) & set(other) and one[0] != later[0]
    plain = GenerateRequest(request_id="r", sampling=SamplingParams(), messages=[ChatMessage("user", "hi")])
    assert prompt_text(_look("hi")) == prompt_text(plain)  # text parts render as the content does


def test_prefix_table_prefers_the_longest_known_prefix_on_a_live_replica() -> None:
    table = PrefixTable(max_keys=4)
    table.record([b"a", b"ab"], "r1")
    table.record([b"a"], "r2")
    assert table.preferred([b"a", b"ab", b"abc"], {"r1", "r2"}) == "r1"
    assert table.preferred([b"a", b"ab"], {"r2"}) == "r2"  # r1 is gone
    assert table.preferred([b"z"], {"r1", "r2"}) is None
    table.record([b"c", b"d", b"e"], "r3")
    assert len(table) == 4  # LRU bound


def test_a_prefix_every_live_replica_served_prefers_none() -> None:
    """A system prompt both replicas hold: least-loaded decides; a conversation's own longer prefix
    still goes where it was served."""
    table = PrefixTable()
    table.record([b"sys"], "r1")
    assert table.preferred([b"sys", b"sys+q2"], {"r1", "r2"}) == "r1"
    table.record([b"sys", b"sys+q1"], "r2")
    assert table.preferred([b"sys", b"sys+q3"], {"r1", "r2"}) is None
    assert table.preferred([b"sys", b"sys+q1", b"sys+q1+a1"], {"r1", "r2"}) == "r2"
    assert table.preferred([b"sys"], {"r1", "r2", "r3"}) == "r2"  # r3 holds it not: the latest does


@pytest.mark.parametrize(
    ("spec", "fields"),
    [
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 1}}, ["min_replicas", "max_replicas"]),
        ({"autoscaling": {"upscale_delay_s": -1}}, ["upscale_delay_s"]),
        ({"autoscaling": {"downscale_to_zero_delay_s": -0.5}}, ["downscale_to_zero_delay_s"]),
        ({"replicas": 2, "autoscaling": {"max_replicas": 3}}, ["replicas", "autoscaling"]),
    ],
)
def test_bad_autoscaling_names_the_fields(spec: dict[str, object], fields: list[str]) -> None:
    with pytest.raises(ValidationError) as err:
        ModelConfig.model_validate({"name": "m", "backend": "synthetic", **spec})
    text = str(err.value)
    assert all(f in text for f in fields), text


def test_an_autoscaled_spec_round_trips_without_replicas() -> None:
    spec = ModelConfig.model_validate(
        {"name": "m", "backend": "synthetic", "autoscaling": {"max_replicas": 3}}
    )
    dumped = spec.model_dump(mode="json")
    assert "replicas" not in dumped
    assert ModelConfig.model_validate(dumped) == spec
