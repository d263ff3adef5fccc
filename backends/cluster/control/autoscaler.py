"""Autoscaling decisions: how many replicas a deployment should run, from the load every gateway
reports. Pure logic (time is passed in), so it is tested without Ray; the controller feeds it.

Load is *ongoing requests*: those a gateway has handed to the model's replicas or holds for them
(queued for a slot, or waiting for a replica to start). Each gateway reports its own counts every
`REPORT_SECONDS`; the controller sums the fresh reports, so the decision sees the whole cluster,
and a gateway that stopped reporting (gone) stops counting after `STALE_SECONDS`.

The wanted count is `ceil(ongoing / target_ongoing_requests)`, clamped to
`[min_replicas, max_replicas]`. A change must be wanted for the whole delay first
(`upscale_delay_s`, `downscale_delay_s`, `downscale_to_zero_delay_s`): a wish in the other
direction restarts the clock. Two exceptions: from zero, one replica is wanted at once (a request
is waiting for it); and the last replica goes only after the to-zero delay, from one.

`initial_target` and `target_for` say what count a spec aims at when it is deployed or updated,
before any load is known: its fixed `replicas`, or a count within its autoscaling range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from raygate.protocol.config import ModelConfig
from raygate.protocol.policies import AutoscalingConfig

REPORT_SECONDS = 0.5
STALE_SECONDS = 5.0


def initial_target(spec: ModelConfig) -> int:
    """Replicas to start a deployment with."""
    scaling = spec.autoscaling
    if scaling is None:
        return spec.replicas
    return scaling.min_replicas if scaling.initial_replicas is None else scaling.initial_replicas


def target_for(current: ModelConfig, spec: ModelConfig, target: int) -> int:
    """The count a new `spec` aims at when it replaces `current` (aiming at `target`): its
    `replicas`, or the current count within its range."""
    scaling = spec.autoscaling
    if scaling is None:
        return spec.replicas
    if current.autoscaling is None and scaling.initial_replicas is not None:
        return scaling.initial_replicas
    return max(scaling.min_replicas, min(scaling.max_replicas, target))


@dataclass
class LoadReports:
    """Ongoing requests per model, as each gateway last reported them."""

    _by_gateway: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)

    def report(self, gateway: str, load: dict[str, float], now: float) -> None:
        self._by_gateway[gateway] = (now, dict(load))

    def total(self, model: str, now: float) -> float:
        fresh = {g: (t, load) for g, (t, load) in self._by_gateway.items() if now - t <= STALE_SECONDS}
        self._by_gateway = fresh
        return sum(load.get(model, 0.0) for _, load in fresh.values())


@dataclass
class Decision:
    """A new replica count and why (kept as the scaling event's reason)."""

    replicas: int
    reason: str


@dataclass
class Autoscaler:
    """One deployment's pending wish and since when it has been wished (module docstring)."""

    config: AutoscalingConfig
    _wish: int | None = None
    _since: float = 0.0

    def wanted(self, ongoing: float) -> int:
        c = self.config
        count = math.ceil(ongoing / c.target_ongoing_requests - 1e-9) if ongoing > 0 else 0
        return max(c.min_replicas, min(c.max_replicas, count))

    def decide(self, current: int, ongoing: float, now: float) -> Decision | None:
        """A new replica count once its delay has passed, else None. `current` is the count aimed at
        now (not how many are ready: loading replicas are already on their way)."""
        wanted = self.wanted(ongoing)
        if current == 0 and ongoing > 0:
            self._wish = None
            return Decision(max(wanted, 1), f"scale from zero: ongoing={ongoing:g}")
        if wanted == 0 and current > 1:
            wanted = 1  # the last replica leaves on its own delay
        if wanted == current:
            self._wish = None
            return None
        up = wanted > current
        if self._wish is None or (self._wish > current) != up:
            self._wish, self._since = wanted, now  # a new wish, or the direction turned: restart the clock
        self._wish = wanted
        c = self.config
        delay = c.upscale_delay_s if up else c.to_zero_delay_s if wanted == 0 else c.downscale_delay_s
        if now - self._since < delay:
            return None
        self._wish = None
        target = f"target={c.target_ongoing_requests:g}"
        return Decision(wanted, f"ongoing={ongoing:g} {target}: {current} -> {wanted}")

    def reset(self) -> None:
        self._wish = None
