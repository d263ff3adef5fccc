"""The replica's side of a traced request: its spans, exported from the replica's own process.

A request that crossed the Ray hop with a `TraceCarrier` gets, under the gateway's replica-call
span, a `replica.generate` span for its time in this actor, and under it `engine.queue` (the
wait inside the engine for a slot, when the engine says: `Delta.queued`), `engine.prefill` (from
the slot to the first delta: the prompt's evaluation; from arrival when the engine does not say)
and `engine.decode` (first delta to last, with one `tokens` event per batch sent back: the
tokens so far and the deltas in the batch). Before the queue, the replica prepares the prompt
(chat template, tokens, grammar): the gap under `replica.generate`. The queue and prefill spans
are written once the first delta has told how the time divides. A call answered whole
(embeddings, rerank and score) gets `replica.embed` / `replica.rank` around one `engine.embed` /
`engine.rank` span, with the prompt tokens it read. Measured here rather than reported to the
gateway, so the times are this process's clock and a viewer shows which replica, on which node,
spent them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable
from typing import Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from raygate.backends.cluster.runtime.tracing import tracer_provider
from raygate.protocol.generation import Delta, TraceCarrier

_PROPAGATOR = TraceContextTextMapPropagator()


class _Counted(Protocol):
    prompt_tokens: int


T = TypeVar("T", bound=_Counted)


def _replica_span(carrier: TraceCarrier, name: str, attributes: dict[str, str | int]) -> tuple[Tracer, Span]:
    """The replica's tracer for the carrier's exporter, and the call's outer span, a child of the
    gateway's replica-call span."""
    provider = tracer_provider(carrier.endpoint, carrier.protocol, carrier.service_name, "replica")
    tracer = provider.get_tracer("raygate.replica")
    headers = {"traceparent": carrier.traceparent}
    if carrier.tracestate:
        headers["tracestate"] = carrier.tracestate
    parent = _PROPAGATOR.extract(headers)
    return tracer, tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


def _failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))


async def traced_call(
    carrier: TraceCarrier, operation: str, attributes: dict[str, str | int], call: Awaitable[T]
) -> T:
    """`call`'s answer, with `replica.<operation>` around `engine.<operation>` (module docstring)."""
    tracer, outer = _replica_span(carrier, f"replica.{operation}", attributes)
    engine = tracer.start_span(f"engine.{operation}", context=trace.set_span_in_context(outer))
    outcome = "cancelled"  # the gateway gave up on it (client gone, deadline)
    try:
        result = await call
        outcome = "finished"
        for span in (engine, outer):
            span.set_attribute("gen_ai.usage.input_tokens", result.prompt_tokens)
        return result
    except Exception as exc:
        outcome = "failed"
        for span in (engine, outer):
            _failed(span, exc)
        raise
    finally:
        engine.end()
        outer.set_attribute("raygate.outcome", outcome)
        outer.end()


async def traced_batches(
    carrier: TraceCarrier,
    attributes: dict[str, str | int],
    batches: AsyncGenerator[list[Delta], None],
) -> AsyncGenerator[list[Delta], None]:
    """`batches`, passed through unchanged (and closed with this), with the spans of the module
    docstring around them."""
    tracer, outer = _replica_span(carrier, "replica.generate", attributes)
    inside = trace.set_span_in_context(outer)
    arrived: int | None = time.time_ns()  # until the first delta: the prefill's spans are not out yet
    decode: Span | None = None
    last: Delta | None = None
    outcome = "cancelled"  # the gateway closed the stream early (client gone, timeout)
    try:
        async for batch in batches:
            if batch:
                last = batch[-1]
            if arrived is not None:
                _prefill_spans(tracer, inside, arrived, time.time_ns(), last)
                arrived = None
                decode = tracer.start_span("engine.decode", context=inside)
            if decode is not None and last is not None:
                tokens = {"completion_tokens": last.completion_tokens, "deltas": len(batch)}
                decode.add_event("tokens", tokens)
            if last is not None and last.finish_reason is not None:
                outcome = "finished"  # the engine ended it: the gateway may close before pulling again
            yield batch
        outcome = "finished"
    except Exception as exc:
        outcome = "failed"
        _failed(outer, exc)
        raise
    finally:
        await batches.aclose()  # early exit: the engine stream closes before the spans end
        if arrived is not None:  # no delta came: the time was all queue or prefill, undivided
            _prefill_spans(tracer, inside, arrived, time.time_ns(), None)
        if decode is not None:
            decode.end()
        outer.set_attribute("raygate.outcome", outcome)
        if last is not None:
            outer.set_attribute("gen_ai.usage.input_tokens", last.prompt_tokens)
            outer.set_attribute("gen_ai.usage.output_tokens", last.completion_tokens)
            if last.finish_reason is not None:
                outer.set_attribute("gen_ai.response.finish_reasons", [last.finish_reason])
        outer.end()


def _prefill_spans(tracer: Tracer, inside: Context, arrived: int, now: int, first: Delta | None) -> None:
    """`engine.queue` (when the first delta says when the engine queued the request and gave it a
    slot) and `engine.prefill` from the slot, or from `arrived`, to `now` (Unix ns)."""
    queued = first.queued if first is not None else None
    started = arrived
    if queued is not None:
        entered, started = (min(max(arrived, int(t * 1e9)), now) for t in queued)
        tracer.start_span("engine.queue", context=inside, start_time=entered).end(end_time=started)
    prefill = tracer.start_span("engine.prefill", context=inside, start_time=started)
    if first is not None:
        prefill.set_attribute("gen_ai.usage.input_tokens", first.prompt_tokens)
        if first.cached_tokens is not None:
            prefill.set_attribute("raygate.cached_tokens", first.cached_tokens)
    prefill.end(end_time=now)
