"""A real OTLP receiver for the tracing tests: Arize Phoenix, started on loopback.

Phoenix (PyPI: arize-phoenix) takes OTLP traces over gRPC and HTTP, stores them in SQLite, and
serves them back through its REST API (`GET /v1/projects/{project}/spans`: names, trace and span
ids, parent ids, kinds, attributes, events), which is what the tests read. It is the lightest real
receiver the package registries offer here: Jaeger and the OpenTelemetry Collector are Go binaries
published on neither PyPI nor npm. It pins its own fastapi/sqlalchemy/grpcio versions, so it lives
in its own virtual environment, created once per machine under `~/.cache/raygate/phoenix-venv`
with a pinned version and pinned dependencies (phoenix-constraints.txt). uv (one wheel from PyPI)
installs its ~140 packages in parallel: under a minute here, where pip took almost eight.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

PHOENIX_VERSION = "20.26.1"
UV_VERSION = "0.9.13"
VENV = Path("~/.cache/raygate/phoenix-venv").expanduser()
READY_MARK = f".phoenix-{PHOENIX_VERSION}-ready"
# Every package of the venv pinned (a `pip freeze` of it): the same receiver on every machine.
CONSTRAINTS = Path(__file__).with_name("phoenix-constraints.txt")
START_TIMEOUT_S = 240.0  # its database migrations run at start: a minute on a loaded 2-core box


def phoenix_executable() -> Path:
    """The venv's `phoenix` command, creating the venv once per machine (from the package index)."""
    phoenix = VENV / "bin" / "phoenix"
    if (VENV / READY_MARK).exists():
        return phoenix
    if VENV.exists():
        shutil.rmtree(VENV)  # a half-made one from an interrupted run
    venv.EnvBuilder(with_pip=True).create(VENV)
    python = VENV / "bin" / "python"
    uv = VENV / "bin" / "uv"
    install = [str(uv), "pip", "install", "-q", "--python", str(python), "-c", str(CONSTRAINTS)]
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"uv=={UV_VERSION}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run([*install, f"arize-phoenix=={PHOENIX_VERSION}"], check=True, stdout=subprocess.DEVNULL)
    (VENV / READY_MARK).touch()
    return phoenix


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Phoenix:
    """A running Phoenix: where to send OTLP, and its spans read back."""

    def __init__(self, http_port: int, grpc_port: int) -> None:
        self.url = f"http://127.0.0.1:{http_port}"
        self.otlp_grpc = f"http://127.0.0.1:{grpc_port}"
        self.otlp_http = f"{self.url}/v1/traces"

    def spans(self, project: str = "default") -> list[dict[str, Any]]:
        """Every span Phoenix holds for `project` (its REST API, page by page)."""
        spans: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            r = httpx.get(f"{self.url}/v1/projects/{project}/spans", params=params, timeout=30)
            r.raise_for_status()
            body = r.json()
            spans.extend(body["data"])
            cursor = body.get("next_cursor")
            if not cursor:
                return spans

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [s for s in self.spans() if s["context"]["trace_id"] == trace_id]


@contextmanager
def running_phoenix(workdir: Path) -> Iterator[Phoenix]:
    """Phoenix on free loopback ports with its SQLite under `workdir`; stopped on exit."""
    phoenix = phoenix_executable()
    http_port, grpc_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(http_port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (workdir / "phoenix.log").open("wb")
    proc = subprocess.Popen([str(phoenix), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    receiver = Phoenix(http_port, grpc_port)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"phoenix exited with {proc.returncode}: see {workdir / 'phoenix.log'}")
            try:
                if httpx.get(f"{receiver.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"phoenix not up within {START_TIMEOUT_S:g} s: see {workdir / 'phoenix.log'}"
                )
            time.sleep(0.5)
        yield receiver
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
