"""The replica's queue and prefill spans (backends/cluster/routing/replica_trace.py), recorded by
OpenTelemetry's own SDK into its in-memory exporter: the engine's `Delta.queued` divides the time
before the first token into `engine.queue` and `engine.prefill`."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from raygate.backends.cluster.routing.replica_trace import _prefill_spans
from raygate.protocol.generation import Delta

S = 1_000_000_000  # ns in a second


def spans(arrived: int, now: int, first: Delta | None) -> dict[str, ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    outer = tracer.start_span("replica.generate", start_time=arrived)
    _prefill_spans(tracer, trace.set_span_in_context(outer), arrived, now, first)
    outer.end(end_time=now)
    return {s.name: s for s in exporter.get_finished_spans()}


def test_the_engine_queue_and_the_prefill_divide_at_the_slot() -> None:
    first = Delta("Hi", 1, 12, cached_tokens=4, queued=(100.25, 100.5))
    got = spans(100 * S, 101 * S, first)
    queue, prefill = got["engine.queue"], got["engine.prefill"]
    assert (queue.start_time, queue.end_time) == (100 * S + S // 4, 100 * S + S // 2)
    assert (prefill.start_time, prefill.end_time) == (100 * S + S // 2, 101 * S)
    assert prefill.attributes is not None and prefill.attributes["gen_ai.usage.input_tokens"] == 12
    assert prefill.attributes["raygate.cached_tokens"] == 4
    outer = got["replica.generate"].context
    assert queue.parent is not None and prefill.parent is not None and outer is not None
    assert queue.parent.span_id == prefill.parent.span_id == outer.span_id


def test_without_the_engines_word_the_prefill_runs_from_arrival() -> None:
    got = spans(100 * S, 101 * S, Delta("Hi", 1, 12))
    assert "engine.queue" not in got
    assert (got["engine.prefill"].start_time, got["engine.prefill"].end_time) == (100 * S, 101 * S)
    nothing = spans(100 * S, 101 * S, None)  # the stream ended before its first delta
    assert set(nothing) == {"replica.generate", "engine.prefill"}


def test_times_from_another_clock_stay_inside_the_replicas_span() -> None:
    first = Delta("Hi", 1, 12, queued=(99.0, 102.0))  # before arrival, after the first token
    queue = spans(100 * S, 101 * S, first)["engine.queue"]
    assert (queue.start_time, queue.end_time) == (100 * S, 101 * S)
