"""The console's metric series (server/observability/metrics_history.py): rates and TTFT quantiles per interval,
computed from the gateway's real registry (server/observability/metrics.py)."""

from __future__ import annotations

import pytest

from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.observability.metrics_history import MetricsHistory, quantile


def test_quantile_interpolates_inside_the_bucket_like_prometheus() -> None:
    before = ((0.1, 0.0), (1.0, 0.0), (float("inf"), 0.0))
    after = ((0.1, 2.0), (1.0, 4.0), (float("inf"), 4.0))
    assert quantile(0.5, before, after) == pytest.approx(0.1)  # rank 2 ends the first bucket
    assert quantile(0.75, before, after) == pytest.approx(0.1 + 0.9 * 0.5)
    assert quantile(0.5, after, after) is None  # nothing arrived in the interval
    beyond = ((0.1, 0.0), (1.0, 0.0), (float("inf"), 1.0))
    assert quantile(0.95, before, beyond) == 1.0  # +Inf reports the highest finite bound


def test_series_are_per_interval_rates_and_gauges() -> None:
    metrics, history = GatewayMetrics(), MetricsHistory()
    metrics.set_queue("chat", 0, 0)
    history.record(metrics, at=100.0)
    for _ in range(10):
        metrics.http_requests.inc({"endpoint": "/v1/chat/completions", "status": "200", "model_name": "chat"})
        metrics.ttft.observe({"model_name": "chat"}, 0.03)
    metrics.generation_tokens.add({"model_name": "chat"}, 50)
    metrics.set_queue("chat", 3, 1)
    history.record(metrics, at=105.0)
    history.record(metrics, at=110.0)  # an idle interval

    chat = history.series().models["chat"]
    assert chat.t == [105.0, 110.0]
    assert chat.requests_per_s == [2.0, 0.0]
    assert chat.tokens_per_s == [10.0, 0.0]
    assert chat.ttft_p50_s[0] == pytest.approx(0.03) and chat.ttft_p95_s[0] is not None
    assert chat.ttft_p50_s[1] is None and chat.ttft_p95_s[1] is None
    assert chat.running == [3.0, 3.0] and chat.waiting == [1.0, 1.0]


def test_a_model_without_traffic_and_the_ring_bound() -> None:
    metrics, history = GatewayMetrics(), MetricsHistory(keep=3)
    metrics.set_queue("idle", 0, 0)  # no TTFT observed: must not break the sample
    for at in range(5):
        history.record(metrics, at=float(at))
    idle = history.series().models["idle"]
    assert idle.t == [3.0, 4.0]  # three samples kept, two intervals
    assert idle.ttft_p50_s == [None, None] and idle.requests_per_s == [0.0, 0.0]


def test_an_undeployed_model_leaves_the_series() -> None:
    metrics, history = GatewayMetrics(), MetricsHistory()
    metrics.set_queue("kept", 0, 0)
    metrics.set_queue("gone", 0, 0)  # its gauges stay in the registry after an undeploy
    history.record(metrics, at=0.0, live={"kept", "gone"})
    history.record(metrics, at=5.0, live={"kept", "gone"})
    history.record(metrics, at=10.0, live={"kept"})
    series = history.series().models
    assert series["kept"].t == [5.0, 10.0] and series["gone"].t == [5.0]
