"""The replica's side of a traced request: its spans, exported from the replica's own process.

A request that crossed the Ray hop with a `TraceCarrier` gets, under the gateway's replica-call
span, a `replica.generate` span for its time in this actor, and under it `engine.prefill` (from
arrival to the first delta: the engine's queue and the prompt's prefill) and `engine.decode`
(first delta to last, with one `tokens` event per batch sent back: the tokens so far and the
deltas in the batch). Measured here rather than reported to the gateway, so the times are this
process's clock and a viewer shows which replica, on which node, spent them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from raygate.backends.cluster.runtime.tracing import tracer_provider
from raygate.protocol.generation import Delta, TraceCarrier

_PROPAGATOR = TraceContextTextMapPropagator()


async def traced_batches(
    carrier: TraceCarrier,
    attributes: dict[str, str | int],
    batches: AsyncGenerator[list[Delta], None],
) -> AsyncGenerator[list[Delta], None]:
    """`batches`, passed through unchanged (and closed with this), with the spans of the module
    docstring around them."""
    provider = tracer_provider(carrier.endpoint, carrier.protocol, carrier.service_name, "replica")
    tracer = provider.get_tracer("raygate.replica")
    headers = {"traceparent": carrier.traceparent}
    if carrier.tracestate:
        headers["tracestate"] = carrier.tracestate
    parent = _PROPAGATOR.extract(headers)
    outer = tracer.start_span("replica.generate", context=parent, kind=SpanKind.SERVER, attributes=attributes)
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
        outer.record_exception(exc)
        outer.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
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
