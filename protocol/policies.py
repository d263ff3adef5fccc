"""A deployment's replica policies: which replica serves a request, and how many replicas run.

Both are blocks of a `models.yaml` entry (`routing:`, `autoscaling:`) that say how the model is
served rather than what is loaded: the gateway's router (backends/cluster/routing/router.py) applies
`RoutingConfig` to every request, the controller's autoscaler (backends/cluster/control/autoscaler.py)
applies `AutoscalingConfig` on every tick, and an update that changes only them is applied in place
without reloading a replica. They live here, apart from `ModelConfig`'s weights, engine and
resources (config.py), so the spec module stays the schema of one deployment and these two
policies, with their own validation and defaults, read on their own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raygate.protocol.base import StrictModel

RoutingPolicy = Literal["least_loaded", "prefix_affinity"]


class RoutingConfig(StrictModel):
    """How a gateway picks one of the model's ready replicas for each request.

    `prefix_affinity` sends a request whose prompt starts like an earlier one (the system prompt,
    the earlier turns of a conversation) to the replica that served that prefix last, so the
    engine's prompt cache (llama.cpp) or prefix cache (vLLM) skips re-reading it; it falls back to
    the least-loaded replica when the preferred one has `max_imbalance` more requests in flight.
    """

    # The default is what `python -m bench.routing` measured better (docs/performance.md,
    # "Routing and cold start"): TTFT p50 12-18x lower where each conversation carries its own context, within
    # 0.96-1.08x of least-loaded where prompts share only a system prompt or nothing at all.
    policy: RoutingPolicy = Field(
        "prefix_affinity", description="`prefix_affinity` (default) or `least_loaded`."
    )
    max_imbalance: int = Field(
        2,
        ge=0,
        le=10_000,
        description="In-flight requests the preferred replica may have above the least-loaded one "
        "before a request falls back to least-loaded.",
    )
    block_chars: int = Field(
        256,
        ge=16,
        le=1_000_000,
        description="Prompt characters per prefix block: a prefix is known block by block.",
    )
    max_blocks: int = Field(
        64, ge=1, le=4096, description="Leading blocks of a prompt that are hashed (the rest is ignored)."
    )


class AutoscalingConfig(StrictModel):
    """Replica count driven by load (Ray Serve's names): the controller sums the requests every gateway
    reports as ongoing, and aims at `ceil(ongoing / target_ongoing_requests)` replicas within
    `[min_replicas, max_replicas]` and within what the cluster can place. A change must hold for the
    delay first; removed replicas drain (no request is cut). `min_replicas: 0` scales to zero: the
    next request waits while a replica starts."""

    min_replicas: int = Field(1, ge=0, le=64, description="Fewest replicas; 0 allows scale to zero.")
    max_replicas: int = Field(1, ge=1, le=64, description="Most replicas.")
    initial_replicas: int | None = Field(
        None, ge=0, le=64, description="Replicas at deploy (default: `min_replicas`)."
    )
    target_ongoing_requests: float = Field(
        2.0, gt=0, le=1e6, allow_inf_nan=False, description="Ongoing requests each replica should carry."
    )
    upscale_delay_s: float = Field(
        3.0, ge=0, le=86_400, allow_inf_nan=False, description="Seconds more load must last before adding."
    )
    downscale_delay_s: float = Field(
        60.0, ge=0, le=86_400, allow_inf_nan=False, description="Seconds less load must last before removing."
    )
    downscale_to_zero_delay_s: float | None = Field(
        None,
        ge=0,
        le=86_400,
        allow_inf_nan=False,
        description="Seconds without any request before the last replica goes "
        "(default: `downscale_delay_s`).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"`autoscaling.min_replicas` ({self.min_replicas}) is greater than "
                f"`autoscaling.max_replicas` ({self.max_replicas})"
            )
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError(
                f"`autoscaling.initial_replicas` ({initial}) must lie between `autoscaling.min_replicas` "
                f"({self.min_replicas}) and `autoscaling.max_replicas` ({self.max_replicas})"
            )
        return self

    @property
    def to_zero_delay_s(self) -> float:
        return (
            self.downscale_delay_s
            if self.downscale_to_zero_delay_s is None
            else self.downscale_to_zero_delay_s
        )
