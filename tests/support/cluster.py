"""A real multi-node Ray cluster on this machine: `ray start --head`, then `ray start --address`
for each extra raylet, each with its own temp dir and ports.

Other Ray clusters may run on the same machine, so nothing here uses `ray stop`: every node runs
`ray start --block` in its own process group, and is stopped (or "crashed") by signalling that
group. Ray's worker processes die with their raylet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bench.servers import free_port
from raygate.backends.cluster.runtime.connection import LOCAL_RAY_ENV, START_ATTEMPTS, is_start_failure
from tests.support.gateway import GatewayProcess, start_gateway

RAY = Path(sys.executable).parent / "ray"
# Notice a dead node within ~2 s instead of Ray's default ~15 s (the node-death test waits on it).
HEAD_SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
# A bound on a hang, not an expectation: two gateways starting at once on three raylets took over
# the default 240 s to be ready on two busy cores (each Ray worker a Python start at load ~40).
GATEWAY_START_S = 900


def _raylet_died(temp_dir: Path) -> bool:
    """The node's raylet wrote its fatal line (RAY_CHECK: `... C ...] (raylet) ... Check failed`)."""
    for log in temp_dir.glob("session_*/logs/raylet.out"):
        if "Check failed" in log.read_text(errors="replace"):
            return True
    return False


@dataclass
class RayNode:
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: BinaryIO

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 3) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            # At load 30 a killed `ray start` took over 10 s to be reaped; raising here leaked
            # its Popen, whose ResourceWarning then failed an unrelated later test.
            self.proc.wait(120)
        self.kill_group()
        self.log_file.close()

    def kill_group(self) -> None:
        """Whatever the node started in its process group and left behind (gcs, raylet, agents)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class LocalCluster:
    root: Path
    address: str = ""
    env: dict[str, str] = field(default_factory=dict)  # for every node, over this process's
    nodes: list[RayNode] = field(default_factory=list)
    starts: int = 0  # `ray start`s so far, each given its own temp dir

    def _start(self, name: str, args: list[str], timeout: float = 600) -> RayNode:
        """`ray start` for one node, started again when its raylet died during the start (Ray
        2.60's raylet aborts when its dashboard agent takes over 15 s to come up on a busy box, and
        `ray start --block` then says nothing for minutes) or `ray start` gave up on a starved node
        (connection.START_FAILURES)."""
        for attempt in range(1, START_ATTEMPTS + 1):
            node = self._start_once(name, attempt, args, timeout)
            if node is not None:
                return node
        raise RuntimeError(f"ray node {name}: failed in each of {START_ATTEMPTS} starts (see {name}.*.log)")

    def _start_once(self, name: str, attempt: int, args: list[str], timeout: float) -> RayNode | None:
        """The started node, or None when its raylet died during the start or `ray start` failed
        as connection.START_FAILURES says (its processes are killed before returning)."""
        log_path = self.root / f"{name}.{attempt}.log"
        log_file = log_path.open("wb")
        ports = [
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--metrics-export-port",
            str(free_port()),
        ]
        # Short: Ray's unix socket paths under it must stay within ~107 characters. A new one for
        # every start: in a used one, `_raylet_died` would read a predecessor's fatal raylet line
        # and give the new node up at once.
        self.starts += 1
        temp_dir = self.root / f"{name[0]}{self.starts}"
        proc = subprocess.Popen(
            [
                str(RAY),
                "start",
                "--block",
                "--disable-usage-stats",
                "--temp-dir",
                str(temp_dir),
                *ports,
                *args,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Replicas at normal priority, as the image's and compose's nodes run them (connection.py).
            env={**os.environ, **self.env, **LOCAL_RAY_ENV},
        )
        node = RayNode(proc, log_path, log_file)
        deadline = time.monotonic() + timeout
        try:
            while "Ray runtime started" not in (log := log_path.read_text(errors="replace")):
                if _raylet_died(temp_dir) or (proc.poll() is not None and is_start_failure(log)):
                    node.stop()
                    return None
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ray node {name} did not start:\n{log[-3000:]}")
                time.sleep(0.3)
        except BaseException:  # pytest-timeout firing mid-start too: never leave the node behind
            node.stop()
            raise
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: float, resources: dict[str, float]) -> None:
        port = free_port()
        self._start(
            "head",
            [
                "--head",
                "--port",
                str(port),
                "--num-cpus",
                str(num_cpus),
                "--resources",
                json.dumps(resources),
                "--include-dashboard",
                "false",
                "--dashboard-port",
                str(free_port()),
                "--system-config",
                json.dumps(HEAD_SYSTEM_CONFIG),
            ],
        )
        self.address = f"127.0.0.1:{port}"

    def add_node(self, name: str, num_cpus: float, resources: dict[str, float]) -> RayNode:
        return self._start(
            name,
            ["--address", self.address, "--num-cpus", str(num_cpus), "--resources", json.dumps(resources)],
        )

    def start_gateways(self, config: Path, count: int = 2) -> list[GatewayProcess]:
        """`count` gateways on this cluster, started at once: whichever reaches Ray first creates
        the controller, the others attach. If one fails, none is left running."""
        args = ["--config", str(config), "--ray-address", self.address]
        with ThreadPoolExecutor(count) as pool:
            starting = [
                pool.submit(start_gateway, args, self.root / f"gw{i}.log", None, GATEWAY_START_S)
                for i in range(1, count + 1)
            ]
        started = [f.result() for f in starting if f.exception() is None]
        for future in starting:
            if (exc := future.exception()) is not None:
                for gateway in started:
                    gateway.stop()
                raise exc
        return started

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def alive_nodes(self) -> list[dict[str, object]]:
        """`ray.nodes()` as a separate driver sees it (this test process is already attached to the
        session's own Ray, and a process attaches to one cluster only)."""
        code = (
            f"import json, ray; ray.init(address={self.address!r}, log_to_driver=False); "
            "print(json.dumps([{'id': n['NodeID'], 'resources': n['Resources']} for n in ray.nodes() if n['Alive']]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        ).stdout
        nodes: list[dict[str, object]] = json.loads(out.strip().splitlines()[-1])
        return nodes
