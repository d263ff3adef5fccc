"""The gateway's OpenTelemetry spans: one per HTTP request, and its children (docs/tracing.md).

`Tracing` exists only when `--otlp-traces-endpoint` is set; without it the middleware creates no
`RequestTrace` and every hook below is one `is None` check (no OpenTelemetry import either).

A request's span (kind SERVER, named `METHOD route`) continues the caller's trace when the request
carries a W3C `traceparent` (and `tracestate`), and its own `traceparent` goes back in the
response's headers, so a client can find the trace it caused. It holds the route, the model, the
API key's name (never the key), the status, the token usage and the time to first token. Under it:
`admission` (the wait for a running slot) and one `replica.call` per engine call (kind CLIENT),
whose context crosses the Ray hop in the request's `TraceCarrier`; the replica's own spans
(backends/cluster/routing/replica_trace.py) hang under that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raygate.backends.cluster.runtime.tracing import otlp_protocol, service_name, tracer_provider
from raygate.protocol.generation import TraceCarrier

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from raygate.server.context import RequestContext


class Tracing:
    """The gateway's tracer and propagator, made at start-up when an endpoint is configured."""

    def __init__(self, endpoint: str) -> None:
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.endpoint = endpoint
        self.protocol = otlp_protocol()
        self.service_name = service_name()
        provider = tracer_provider(endpoint, self.protocol, self.service_name, "gateway")
        self.tracer: Tracer = provider.get_tracer("raygate.gateway")
        self.propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER

    def start(self, method: str, path: str, headers: dict[str, str], request_id: str) -> RequestTrace:
        """The span of one request, a child of the caller's when its headers carry one."""
        parent = self.propagator.extract(headers)
        span = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self._server,
            attributes={"http.request.method": method, "url.path": path, "raygate.request_id": request_id},
        )
        return RequestTrace(self, span)


class RequestTrace:
    """One request's span and how its parts add children to it."""

    def __init__(self, tracing: Tracing, span: Span) -> None:
        from opentelemetry import trace

        self._tracing = tracing
        self.span = span
        self.first_token_s: float | None = None  # of the request's first engine call that had one
        self._context = trace.set_span_in_context(span)

    def traceparent(self) -> str:
        """The `traceparent` header naming this request's span (returned to the client)."""
        headers: dict[str, str] = {}
        self._tracing.propagator.inject(headers, self._context)
        return headers.get("traceparent", "")

    def child(self, name: str, *, client: bool = False, attributes: dict[str, Any] | None = None) -> Span:
        from opentelemetry.trace import SpanKind

        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        return self._tracing.tracer.start_span(name, context=self._context, kind=kind, attributes=attributes)

    def carrier(self, span: Span) -> TraceCarrier:
        """What crosses the Ray hop so the replica's spans hang under `span`."""
        from opentelemetry import trace

        headers: dict[str, str] = {}
        self._tracing.propagator.inject(headers, trace.set_span_in_context(span))
        return TraceCarrier(
            traceparent=headers["traceparent"],
            tracestate=headers.get("tracestate", ""),
            endpoint=self._tracing.endpoint,
            protocol=self._tracing.protocol,
            service_name=self._tracing.service_name,
        )

    def finish(self, ctx: RequestContext, route: str | None, status: int) -> None:
        """End the request's span once its last byte was sent, with what is known by then."""
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        if route is not None:
            span.update_name(f"{span.name.split(' ', 1)[0]} {route}")  # type: ignore[attr-defined]
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if ctx.model is not None:
            span.set_attribute("gen_ai.request.model", ctx.model)
        if ctx.key is not None:
            span.set_attribute("raygate.key_name", ctx.key.name)
        if status >= 400:
            span.set_attribute("error.type", str(status))
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()


def ended(span: Span, attributes: dict[str, Any], error: BaseException | None = None) -> None:
    """Set `attributes` on `span` and end it; an exception marks it failed (a client gone or a
    deadline is recorded too: it is why the span ended early)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attributes(attributes)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.set_attribute("error.type", type(error).__name__)
    span.end()
