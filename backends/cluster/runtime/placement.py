"""Where actors go. Can the Ray cluster host a replica at all? Asked before deploying and before
replacing a dead replica, so an impossible request is a clear error instead of an actor pending
forever. Which node a replica that asks for no custom resource should prefer
(`replica_preference`). And on which node the state-owning actors live (`state_actor_options`)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raygate.protocol.config import ModelConfig


def replica_demand(spec: ModelConfig) -> dict[str, float]:
    """The Ray resources one replica reserves (what `.options()` asks the scheduler for)."""
    demand = {"CPU": spec.num_cpus, "GPU": spec.num_gpus, **spec.resources}
    return {k: v for k, v in demand.items() if v > 0}


def infeasible_reason(demand: dict[str, float], nodes: list[dict[str, Any]]) -> str | None:
    """None if some alive node's *total* resources cover `demand` (busy nodes free up later)."""
    alive = [n for n in nodes if n.get("Alive")]
    for node in alive:
        totals = node.get("Resources", {})
        if all(totals.get(k, 0.0) >= v for k, v in demand.items()):
            return None
    offers = sorted({str({k: node.get("Resources", {}).get(k, 0.0) for k in demand}) for node in alive})
    return (
        f"no alive node in the Ray cluster can host a replica needing {demand} "
        f"(the {len(alive)} alive node(s) offer {', '.join(offers) or 'nothing'})"
    )


class _Probe:
    """Stands in for the replica class: `.options()` validates without starting anything."""


def invalid_options(spec: ModelConfig) -> str | None:
    """Why Ray would refuse the replicas' actor options (e.g. a resource amount finer than 0.0001),
    or None. Checked before the registry changes: refused when the replicas start, the deployment
    would already be recorded as failed."""
    try:
        ray.remote(_Probe).options(
            num_cpus=spec.num_cpus,
            num_gpus=spec.num_gpus,
            resources=spec.resources or None,
            runtime_env={"env_vars": spec.env} if spec.env else None,
        )
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


async def check_feasible(spec: ModelConfig) -> str | None:
    nodes = await asyncio.to_thread(ray.nodes)  # a GCS round trip: keep it off the event loop
    return infeasible_reason(replica_demand(spec), nodes)


def preferred_node(
    demand: dict[str, float],
    reserved: set[str],
    nodes: list[dict[str, Any]],
    available: dict[str, dict[str, float]],
) -> str | None:
    """The node a replica that asks for no custom resource should go to, or None (Ray's choice).

    A node offering a custom resource that another model requests may be the only place that model
    can run; Ray's own placement fills it with anything once the other nodes pass half their CPUs
    (its hybrid policy spreads), and the model that needs it then finds no room (the chaos hour's
    embedding model, starved by chat replicas). So: among the alive nodes offering none of the
    `reserved` resources, the one with the most CPU free that has room now. None when no such node
    has room: then the replica takes what Ray gives it rather than wait (a preference, not a rule).
    """
    best: tuple[float, str] | None = None
    for node in nodes:
        node_id = node.get("NodeID")
        if not node.get("Alive") or not node_id or reserved & set(node.get("Resources", {})):
            continue
        free = available.get(node_id, {})
        if all(free.get(k, 0.0) + 1e-9 >= v for k, v in demand.items()):
            candidate = (free.get("CPU", 0.0), node_id)
            best = candidate if best is None or candidate > best else best
    return best[1] if best else None


def replica_preference(spec: ModelConfig, reserved: set[str]) -> dict[str, Any]:
    """The actor options that carry `preferred_node`'s choice (none for a spec that asks for custom
    resources itself, or when no other model reserves any): soft node affinity, which falls back
    to any node if the chosen one dies or fills up before the replica lands."""
    if spec.resources or not reserved:
        return {}
    # Two GCS round trips, synchronous: a replica starts rarely (deploy, scale, replacement).
    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    available = ray._private.state.available_resources_per_node()  # type: ignore[no-untyped-call]
    node = preferred_node(replica_demand(spec), reserved, nodes, available)
    if node is None:
        return {}
    return {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=True, _spill_on_unavailable=True)
    }


UNBOUNDED_SLOTS = 1_000_000


def free_slots(demand: dict[str, float], available: dict[str, dict[str, float]]) -> int:
    """How many more replicas needing `demand` fit in the nodes' *available* resources now (one
    replica lives on one node). A replica that reserves nothing fits anywhere, without bound."""
    if not demand:
        return UNBOUNDED_SLOTS
    return sum(
        min(math.floor(free.get(k, 0.0) / v + 1e-9) for k, v in demand.items()) for free in available.values()
    )


async def room_for(spec: ModelConfig) -> int:
    """Replicas of `spec` the cluster can place now, beyond those already placed."""
    demand = replica_demand(spec)
    if not demand:
        return UNBOUNDED_SLOTS
    # A GCS round trip; Ray has no public per-node *available* view (ray.nodes() gives totals).
    available = await asyncio.to_thread(ray._private.state.available_resources_per_node)
    return free_slots(demand, available)


STATE_RESOURCE_DEMAND = 0.01  # a token amount: the resource marks a node, it is not consumed


def state_actor_options(state_resource: str | None) -> dict[str, Any]:
    """Where the actors that own the state directory (controller, Responses store) are created.

    By default on this gateway's node, whose `--state-dir` they write. With `state_resource`, on the
    node that offers that custom Ray resource instead (compose gives it to the head, with the state
    volume): a gateway that restarts then finds them alive on a node that outlived it, rather than
    a dead actor on its own former node (ARCHITECTURE.md, "Where the controller lives").
    """
    if state_resource:
        return {"resources": {state_resource: STATE_RESOURCE_DEMAND}}
    here = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)}
