"""OpenTelemetry tracer providers exporting over OTLP: one per process and destination.

The gateway builds one at start-up when `--otlp-traces-endpoint` is set; a replica actor builds
one the first time a request arrives with a `TraceCarrier` naming that endpoint (the carrier is
how the setting reaches a process the gateway did not start). Both export in batches from a
background thread (the SDK's `BatchSpanProcessor`), so a span costs the request path an append.

Configured as vLLM's `--otlp-traces-endpoint` is: the endpoint from the flag, the protocol from
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (`grpc`, the default, or `http/protobuf`), and everything
else (headers, timeout, compression, certificates, batch sizes) from the standard
`OTEL_EXPORTER_OTLP_*` / `OTEL_BSP_*` variables, which the SDK reads itself. The service name is
`OTEL_SERVICE_NAME` or `raygate`; `OTEL_RESOURCE_ATTRIBUTES` adds to the resource.

The opentelemetry packages (the `otel` extra) are imported only here and only when tracing is
on: a gateway without the flag never loads them.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

DEFAULT_SERVICE_NAME = "raygate"
PROTOCOLS = ("grpc", "http/protobuf")

_providers: dict[tuple[str, str, str, str], TracerProvider] = {}
_lock = threading.Lock()


class TracingUnavailableError(RuntimeError):
    """Tracing was asked for but cannot run (the packages are missing, or the protocol is unknown)."""


def otlp_protocol() -> str:
    """The OTLP protocol the standard variables ask for (vLLM's default: gRPC)."""
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    ).strip()
    if protocol not in PROTOCOLS:
        raise TracingUnavailableError(
            f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r} is not supported; "
            f"use one of {', '.join(PROTOCOLS)}"
        )
    return protocol


def service_name() -> str:
    return os.environ.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME


def tracer_provider(endpoint: str, protocol: str, service: str, component: str) -> TracerProvider:
    """The process's provider for this destination, made on first use. `component` (`gateway`,
    `replica`) goes into the resource as `raygate.component`, so a trace viewer tells the two
    processes of one request apart."""
    key = (endpoint, protocol, service, component)
    with _lock:
        provider = _providers.get(key)
        if provider is None:
            provider = _providers[key] = _make_provider(endpoint, protocol, service, component)
        return provider


def _make_provider(endpoint: str, protocol: str, service: str, component: str) -> TracerProvider:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # pragma: no cover - the extra is in the test environment
        raise TracingUnavailableError(
            f"tracing needs the OpenTelemetry SDK: pip install 'raygate[otel]' ({exc})"
        ) from None
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    resource = Resource.create(
        {"service.name": service, "raygate.component": component, "process.pid": os.getpid()}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def shutdown_providers() -> None:
    """Export what is buffered and stop (a graceful shutdown loses no span)."""
    with _lock:
        providers = list(_providers.values())
        _providers.clear()
    for provider in providers:
        provider.shutdown()
