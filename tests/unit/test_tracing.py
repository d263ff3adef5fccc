"""Tracing's switch (docs/tracing.md): off by default and free when off, on with vLLM's flag, and
the OTLP protocol from the standard variable. The spans themselves are checked against a real
receiver in tests/e2e/test_tracing.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raygate.backends.cluster.runtime.tracing import TracingUnavailableError, otlp_protocol, service_name
from raygate.server.cli import build_parser
from raygate.server.options import from_namespace
from raygate.server.settings import Settings


def settings(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    return from_namespace(Settings, build_parser(environ or {}).parse_args(["serve", *argv]))


def test_tracing_is_off_by_default_and_loads_no_opentelemetry() -> None:
    assert settings([]).otlp_traces_endpoint is None
    probe = (
        "import sys, raygate.server.app, raygate.server.serving.handle, raygate.backends.cluster.routing.replica;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_vllms_flag_and_the_variable_turn_it_on() -> None:
    assert (
        settings(["--otlp-traces-endpoint", "http://collector:4317"]).otlp_traces_endpoint
        == "http://collector:4317"
    )
    env = {"RAYGATE_OTLP_TRACES_ENDPOINT": "http://collector:4317"}
    assert settings([], env).otlp_traces_endpoint == "http://collector:4317"


def test_the_protocol_and_service_name_come_from_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    assert otlp_protocol() == "grpc" and service_name() == "raygate"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert otlp_protocol() == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(TracingUnavailableError, match="http/json"):
        otlp_protocol()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-eu")
    assert service_name() == "gateway-eu"
