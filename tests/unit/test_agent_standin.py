"""The raylet's agents stood in for (`agents.py`, `agent_standin.py`): the command rewrite, and the
stand-in process itself, run as the raylet runs it (a child with a stdin pipe)."""

from __future__ import annotations

import ast
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from raygate.backends.cluster.runtime.agents import STANDIN, lean_raylet_command

NODE = "ab12"


def _raylet_command(session_dir: str) -> list[str]:
    dashboard = [
        sys.executable,
        "-u",
        "agent.py",
        f"--node-id={NODE}",
        "--node-ip-address=127.0.0.1",
        f"--session-dir={session_dir}",
        "--metrics-export-port=0",
    ]
    runtime_env = [
        sys.executable,
        "-u",
        "main.py",
        f"--node-id={NODE}",
        "--node-ip-address=127.0.0.1",
        "--runtime-env-agent-port=0",
        f"--session-dir={session_dir}",
    ]
    return [
        "raylet",
        "--node_id=" + NODE,
        "--dashboard_agent_command=" + subprocess.list2cmdline(dashboard),
        "--runtime_env_agent_command=" + subprocess.list2cmdline(runtime_env),
    ]


def _agent(command: list[str], flag: str) -> list[str]:
    arg = next(arg for arg in command if arg.startswith(flag))
    return shlex.split(arg[len(flag) :])


def _wait_for(path: Path) -> str:
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.05)
    return path.read_text()


def test_the_raylet_command_runs_the_standin_for_both_agents_and_keeps_the_real_runtime_env_agent():
    lean = lean_raylet_command(_raylet_command("/s"))
    dashboard = _agent(lean, "--dashboard_agent_command=")
    assert dashboard[4] == str(STANDIN) and "--" not in dashboard
    assert "--ports=metrics_agent_port,metrics_export_port,dashboard_agent_listen_port" in dashboard
    runtime_env = _agent(lean, "--runtime_env_agent_command=")
    assert runtime_env[4] == str(STANDIN)
    real = runtime_env[runtime_env.index("--") + 1 :]
    assert real[2] == "main.py" and "--runtime-env-agent-port=0" in real
    assert "--host=127.0.0.1" in runtime_env and "--port-flag=runtime-env-agent-port" in runtime_env


def test_a_raylet_command_not_as_expected_is_left_alone():
    command = [arg.replace("--session-dir=", "--session=") for arg in _raylet_command("/s")]
    assert lean_raylet_command(command) == command
    assert lean_raylet_command(["raylet", "--node_id=x"]) == ["raylet", "--node_id=x"]


def test_the_dashboard_standin_writes_unserved_ports_and_exits_with_the_raylet(tmp_path: Path):
    command = _agent(lean_raylet_command(_raylet_command(str(tmp_path))), "--dashboard_agent_command=")
    child = subprocess.Popen(command, stdin=subprocess.PIPE)
    try:
        for name in ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port"):
            assert _wait_for(tmp_path / f"{name}_{NODE}") == "-1"
        assert child.poll() is None
        assert child.stdin is not None
        child.stdin.close()  # the raylet died: its end of the pipe closed
        assert child.wait(timeout=20) == 0
    finally:
        child.kill()


def test_the_runtime_env_standin_becomes_the_real_agent_on_its_port_at_the_first_call(tmp_path: Path):
    record = tmp_path / "argv"
    real = [
        sys.executable,
        "-c",
        f"import os, sys; open({str(record)!r} + '.part', 'w').write(repr((os.getpid(), sys.argv[1:]))); "
        f"os.replace({str(record)!r} + '.part', {str(record)!r}); sys.stdin.read()",
        f"--node-id={NODE}",
        "--node-ip-address=127.0.0.1",
        "--runtime-env-agent-port=0",
        f"--session-dir={tmp_path}",
    ]
    command = lean_raylet_command(["raylet", "--runtime_env_agent_command=" + subprocess.list2cmdline(real)])
    child = subprocess.Popen(_agent(command, "--runtime_env_agent_command="), stdin=subprocess.PIPE)
    try:
        port = int(_wait_for(tmp_path / f"runtime_env_agent_port_{NODE}"))
        assert port > 0 and not record.exists()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        pid, argv = ast.literal_eval(_wait_for(record))
        assert pid == child.pid  # exec: the raylet's watch on the pid holds
        assert f"--runtime-env-agent-port={port}" in argv and "--runtime-env-agent-port=0" not in argv
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(timeout=20) == 0
    finally:
        child.kill()
