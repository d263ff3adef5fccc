"""Running `raygate serve` as a real subprocess, the way users and outside checks start it
(vLLM's RemoteOpenAIServer pattern): real uvicorn, real sockets, real SSE."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx

RAYGATE = Path(sys.executable).parent / "raygate"
REPO = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    log_file: BinaryIO

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log_file.close()
        return int(self.proc.returncode)


def start_gateway(
    args: list[str], log_path: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> GatewayProcess:
    port = free_port()
    full_env = {**os.environ, **(env or {})}
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        [str(RAYGATE), "serve", "--port", str(port), *args],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=REPO,
    )
    gateway = GatewayProcess(proc, port, log_path, log_file)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode}:\n{gateway.log()[-4000:]}")
            try:
                if httpx.get(f"{gateway.url}/health", timeout=2).status_code == 200:
                    return gateway
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    except BaseException:  # e.g. pytest-timeout firing mid-start: never leave the process behind
        gateway.stop()
        raise
    gateway.stop()
    raise RuntimeError(f"gateway did not become healthy in {timeout}s:\n{gateway.log()[-4000:]}")
