"""Running `raygate serve` as a real subprocess, the way users and outside checks start it
(vLLM's RemoteOpenAIServer pattern): real uvicorn, real sockets, real SSE."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.servers import PORT, start, wait_healthy
from bench.servers import Server as GatewayProcess

RAYGATE = Path(sys.executable).parent / "raygate"
REPO = Path(__file__).resolve().parent.parent.parent


def start_gateway(
    args: list[str], log_path: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> GatewayProcess:
    """Start a gateway and return once it is ready: `/ready` (every model it serves has a ready
    replica), not merely `/health` (the process is up), so no test's first request races a
    model that is still loading."""
    gateway = start("gateway", [str(RAYGATE), "serve", "--port", PORT, *args], log_path, env)
    try:
        wait_healthy(gateway, "/ready", timeout)
    except BaseException:  # e.g. pytest-timeout firing mid-start: never leave the process behind
        gateway.stop()
        raise
    return gateway
