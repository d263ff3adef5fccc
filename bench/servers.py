"""Starting the servers under test as subprocesses, and reading their memory from /proc.

Every server gets a random free loopback port and its own log file; stopping one terminates only
the process it started (and lets it stop its own children, e.g. the gateway's embedded Ray).
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import httpx

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


# Ray's default worker ports end below this; the kernel's ephemeral range (port-0 binds, outgoing
# connections) usually starts at 32768.
FIRST_PICKED_PORT = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_GIVEN: set[int] = set()  # every port free_port() returned in this process


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range where there is room: between
    this check and the server's own bind, a port-0 bind elsewhere (Ray's workers and gRPC servers
    start meanwhile) can only take an ephemeral port. A gateway once lost its port that way
    ("address already in use", and every test on it errored)."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    below = range(FIRST_PICKED_PORT, low)
    picks = random.sample(below, min(50, len(below)))
    # Never a port handed out before (it may not be bound yet); 0, the kernel's choice, last.
    for port in [*(p for p in picks if p not in _GIVEN), 0, 0, 0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            picked = int(s.getsockname()[1])
        if picked not in _GIVEN:
            _GIVEN.add(picked)
            return picked
    raise OSError("no free loopback port")


PORT = "{port}"  # an argument that `start` replaces with the free port it picked


@dataclass
class Server:
    """A server started as its own process, logging to a file; the benchmark's targets and the
    tests' gateways alike."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    log_file: BinaryIO

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log_file.close()
        return self.proc.returncode


def start(name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> Server:
    """Start a server on a free port (the `PORT` argument in `argv`); does not wait for it."""
    port = free_port()
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        [str(port) if a == PORT else a for a in argv],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )
    return Server(name, proc, port, log_path, log_file)


def wait_healthy(server: Server, path: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{server.name} did not answer {path} within {timeout:.0f}s:\n{server.log()[-4000:]}")


# -- memory ----------------------------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    """Resident set size of one process, from /proc (no psutil dependency)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """Every process below `root`, by walking /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def replica_pids(gateway_pid: int) -> list[int]:
    """The gateway's embedded Ray runs the replicas as `ray::ModelWorker` worker processes."""
    return sorted(p for p in descendants(gateway_pid) if "ModelWorker" in cmdline(p))


def maps_file(pid: int, path: Path) -> bool:
    """Whether a process has `path` mapped: llama.cpp mmaps its GGUF, which names a replica's model."""
    try:
        return str(path) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


async def update_deployment(http: httpx.AsyncClient, name: str, spec: dict[str, Any]) -> None:
    """`PUT /admin/deployments/<name>` and wait until the update is done: changed in place, or
    every replica replaced by one with the new spec and ready."""
    path = f"/admin/deployments/{name}"
    (await http.put(path, json=spec)).raise_for_status()
    while True:
        state = (await http.get(path)).json()
        if not state["updating"] and state["ready"] == state["desired"]:
            return
        await asyncio.sleep(0.5)
