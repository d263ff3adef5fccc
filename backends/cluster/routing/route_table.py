"""What the controller tells gateways: per deployment, its spec, state and *ready* replicas.

Gateways keep the latest table and route from it; the controller is never asked per request.
Plain dataclasses (actor handles inside) pickle straight across the Ray hop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raygate.protocol.admin import DeploymentState, DownloadProgress, ScalingEvent
from raygate.protocol.config import ModelConfig


@dataclass(slots=True)
class ReplicaRoute:
    """A ready replica as gateways see it: the actor handle to call, its node, its context length,
    the sampling defaults its model folder recommends (`generation_config`), and the Unix socket a
    gateway on its node streams deltas over (`socket_stream.py`; "": none)."""

    id: str
    actor: Any
    node_id: str
    context_length: int
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    socket: str = ""


@dataclass(slots=True)
class DeploymentRoute:
    """One deployment in the route table: spec, state and error, and only its *ready* replicas (loading or
    draining ones are never routed to)."""

    spec: ModelConfig
    state: DeploymentState
    error: str | None
    replicas: list[ReplicaRoute] = field(default_factory=list)
    restarts: int = 0  # dead replicas replaced since the last deploy/scale/update
    desired: int = 0  # the replica count aimed at now (the autoscaler's choice when autoscaled)
    scaling_events: list[ScalingEvent] = field(default_factory=list)  # the latest ones
    scaling_events_total: int = 0
    no_room: str | None = None  # why an autoscaled model at zero cannot start a replica now
    download: DownloadProgress | None = None  # the least advanced Hub download while `downloading`


@dataclass(slots=True)
class RouteTable:
    """`version` grows with every change, so a gateway can ask "anything newer than N?"."""

    version: int
    deployments: list[DeploymentRoute] = field(default_factory=list)
