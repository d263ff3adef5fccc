"""The last minutes of the gateway's own metrics, per model, for the web console's charts.

Prometheus keeps history for those who run one; the console must work without it. So the gateway
samples its registry (`metrics.py`) every few seconds into a short ring buffer and serves the
differences between neighbouring samples as rates: requests/s, generated tokens/s, TTFT p50/p95
over each interval (from the histogram's bucket counts, the way `histogram_quantile` does it), and
the gauges (running, waiting, replicas ready) as they were. Nothing new is measured here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from raygate.backends.cluster.routing.router import ModelRouter
from raygate.protocol.admin import MetricsHistory as MetricsHistoryBody
from raygate.server.observability.metrics import GatewayMetrics

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 5.0
KEEP_SAMPLES = 121  # 10 minutes of intervals at 5 s


@dataclass(frozen=True)
class ModelSample:
    """One model's cumulative counters and current gauges at one instant."""

    requests: float
    generation_tokens: float
    ttft_buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last
    running: float
    waiting: float
    replicas_ready: float


@dataclass(frozen=True)
class Sample:
    """Every model's `ModelSample` at one wall-clock time."""

    at: float
    models: dict[str, ModelSample] = field(default_factory=dict)


def _by_model(values: Iterable[tuple[bytes | str, Any]]) -> dict[str, list[Any]]:
    """aioprometheus keys each series by its labels as JSON; group the values by `model_name`."""
    out: dict[str, list[Any]] = {}
    for key, value in values:
        labels = json.loads(key)
        model = labels.get("model_name")
        if model:
            out.setdefault(model, []).append(value)
    return out


def _sum(values: dict[str, list[Any]], model: str) -> float:
    return float(sum(values.get(model, [])))


def _buckets(metric: Any, model: str, observed: dict[str, list[Any]]) -> tuple[tuple[float, float], ...]:
    if model not in observed:  # no TTFT observed yet (aioprometheus' `get` raises KeyError then)
        return ()
    counts = metric.get({"model_name": model})
    return tuple((float(bound), float(n)) for bound, n in counts.items() if not isinstance(bound, str))


def take_sample(metrics: GatewayMetrics, at: float, live: set[str] | None = None) -> Sample:
    """Read the registry once. Requests are HTTP requests that named the model (any endpoint, any
    status); tokens are generated tokens. `live`: the models deployed now (the registry keeps an
    undeployed model's last gauges forever; its chart ends instead)."""
    requests = _by_model(metrics.http_requests.values.items())
    tokens = _by_model(metrics.generation_tokens.values.items())
    running = _by_model(metrics.running.values.items())
    waiting = _by_model(metrics.waiting.values.items())
    ready = _by_model(metrics.replicas_ready.values.items())
    ttft = _by_model(metrics.ttft.values.items())
    names = set(requests) | set(running) | set(ready) | set(ttft) | set(tokens)
    if live is not None:
        names &= live
    return Sample(
        at,
        {
            name: ModelSample(
                requests=_sum(requests, name),
                generation_tokens=_sum(tokens, name),
                ttft_buckets=_buckets(metrics.ttft, name, ttft),
                running=_sum(running, name),
                waiting=_sum(waiting, name),
                replicas_ready=_sum(ready, name),
            )
            for name in sorted(names)
        },
    )


def quantile(
    q: float, before: tuple[tuple[float, float], ...], after: tuple[tuple[float, float], ...]
) -> float | None:
    """The q-quantile of the observations that arrived between two cumulative bucket snapshots,
    interpolated linearly inside its bucket (Prometheus' `histogram_quantile`); None if none arrived.
    A value in the +Inf bucket reports the highest finite bound."""
    old = dict(before)
    counts = [(bound, n - old.get(bound, 0.0)) for bound, n in after]
    if not counts or counts[-1][1] <= 0:
        return None
    rank = q * counts[-1][1]
    lower, below = 0.0, 0.0
    for bound, cumulative in counts:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


def _rate(new: float, old: float, seconds: float) -> float:
    # A counter that went down was reset (a new gateway process): count from zero.
    return max(new - old if new >= old else new, 0.0) / seconds


class MetricsHistory:
    """A ring buffer of `Sample`s and the per-interval series the console draws."""

    def __init__(self, keep: int = KEEP_SAMPLES) -> None:
        self.samples: deque[Sample] = deque(maxlen=keep)

    def record(self, metrics: GatewayMetrics, at: float | None = None, live: set[str] | None = None) -> None:
        self.samples.append(take_sample(metrics, time.time() if at is None else at, live))

    async def run(self, metrics: GatewayMetrics, routers: Callable[[], list[ModelRouter]]) -> None:
        """Sample every `SAMPLE_SECONDS` until cancelled (the app's lifespan owns the task)."""
        while True:
            try:
                current = routers()
                metrics.observe_replicas(current)  # replica counts live in the routers
                self.record(metrics, live={r.config.name for r in current})
            except Exception:  # a bad sample must not end the charts for the process's life
                log.exception("metrics sample failed")
            await asyncio.sleep(SAMPLE_SECONDS)

    def series(self) -> MetricsHistoryBody:
        """One point per model and interval between neighbouring samples, stamped with the
        interval's end (Unix seconds)."""
        samples = list(self.samples)
        models: dict[str, dict[str, list[float | None]]] = {}
        for prev, cur in pairwise(samples):
            seconds = cur.at - prev.at
            if seconds <= 0:
                continue
            for name, now in cur.models.items():
                before = prev.models.get(name)
                row = models.setdefault(name, {k: [] for k in SERIES})
                row["t"].append(round(cur.at, 3))
                row["requests_per_s"].append(_rate(now.requests, before.requests if before else 0.0, seconds))
                row["tokens_per_s"].append(
                    _rate(now.generation_tokens, before.generation_tokens if before else 0.0, seconds)
                )
                old_buckets = before.ttft_buckets if before else ()
                row["ttft_p50_s"].append(quantile(0.5, old_buckets, now.ttft_buckets))
                row["ttft_p95_s"].append(quantile(0.95, old_buckets, now.ttft_buckets))
                row["running"].append(now.running)
                row["waiting"].append(now.waiting)
                row["replicas_ready"].append(now.replicas_ready)
        return MetricsHistoryBody.model_validate({"interval_s": SAMPLE_SECONDS, "models": models})


SERIES = (
    "t",
    "requests_per_s",
    "tokens_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "running",
    "waiting",
    "replicas_ready",
)
