"""The replica's side of a traced request: its spans, exported from the replica's own process.

A request that crossed the Ray hop with a `TraceCarrier` gets, under the gateway's replica-call
span, a `replica.generate` span for its time in this actor, and under it `engine.prefill` (from
arrival to the first delta: the engine's queue and the prompt's prefill) and `engine.decode`
(first delta to last, with one `tokens` event per batch sent back: the tokens so far and the
deltas in the batch). A call answered whole (embeddings, rerank and score) gets
`replica.embed` / `replica.rank` around one `engine.embed` / `engine.rank` span, with the prompt
tokens it read. Measured here rather than reported to the gateway, so the times are this
process's clock and a viewer shows which replica, on which node, spent them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable
from typing import Protocol, TypeVar

from opentelemetry import trace
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
    prefill: Span | None = tracer.start_span("engine.prefill", context=inside)
    decode: Span | None = None
    last: Delta | None = None
    outcome = "cancelled"  # the gateway closed the stream early (client gone, timeout)
    try:
        async for batch in batches:
            if batch:
                last = batch[-1]
            if prefill is not None:
                if last is not None:
                    prefill.set_attribute("gen_ai.usage.input_tokens", last.prompt_tokens)
                    if last.cached_tokens is not None:
                        prefill.set_attribute("raygate.cached_tokens", last.cached_tokens)
                prefill.end()
                prefill = None
                decode = tracer.start_span("engine.decode", context=inside)
            if decode is not None and last is not None:
                tokens = {"completion_tokens": last.completion_tokens, "deltas": len(batch)}
                decode.add_event("tokens", tokens)
            yield batch
        outcome = "finished"
    except Exception as exc:
        outcome = "failed"
        _failed(outer, exc)
        raise
    finally:
        await batches.aclose()  # early exit: the engine stream closes before the spans end
        for span in (prefill, decode):
            if span is not None:
                span.end()
        outer.set_attribute("raygate.outcome", outcome)
        if last is not None:
            outer.set_attribute("gen_ai.usage.input_tokens", last.prompt_tokens)
            outer.set_attribute("gen_ai.usage.output_tokens", last.completion_tokens)
            if last.finish_reason is not None:
                outer.set_attribute("gen_ai.response.finish_reasons", [last.finish_reason])
        outer.end()
