"""The raylet of an embedded cluster starts `agent_standin.py` in place of Ray's two agents.

`ray.init` has no switch for them, and the raylet fate-shares with both (it exits when either
does, and aborts its start when their port files are late), so they cannot be stopped once up as
the dashboard and the monitor are (`connection._stop_unused`). What each costs and does here
(Ray 2.60, RSS once up):

* the dashboard agent (~105 MB) exports Ray's own metrics and serves the dashboard's node views;
  on Ray without its `[default]` extra (Raygate's dependency) it loads none of its modules and
  does neither. Raygate's metrics are its own (`/metrics`). Stood in for for good.
* the runtime-env agent (~81 MB) prepares an actor's `runtime_env` (a replica's `env:`), and
  nothing else. Stood in for until the raylet first asks for a runtime env; it then becomes the
  real agent (`agent_standin.py`).

The rewrite goes through Ray's private `services.start_ray_process` (the one call that starts the
raylet with its agents' commands); where the raylet's command does not look as expected, it is
left alone and Ray's agents run as before. `raygate serve --ray-dashboard` keeps them.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STANDIN = Path(__file__).with_name("agent_standin.py")
# The raylet's flag for each agent's command -> the port files the agent writes (the first one
# served by a deferred agent, with the real agent's flag for it), or None for an agent stood in
# for for good.
_DASHBOARD = "--dashboard_agent_command="
_RUNTIME_ENV = "--runtime_env_agent_command="
_PORTS = {
    _DASHBOARD: ("metrics_agent_port,metrics_export_port,dashboard_agent_listen_port", None),
    _RUNTIME_ENV: ("runtime_env_agent_port", "runtime-env-agent-port"),
}
_CARRIED = ("--session-dir=", "--node-id=")


def _standin(real: list[str], ports: str, port_flag: str | None) -> list[str] | None:
    carried = [arg for arg in real if arg.startswith(_CARRIED)]
    if len(carried) != len(_CARRIED):
        return None
    # -I -S: the standard library alone (no site-packages, no PYTHON* variables): ~10 MB.
    command = [sys.executable, "-u", "-I", "-S", str(STANDIN), f"--ports={ports}", *carried]
    if port_flag is None:
        return command
    host = next((arg.split("=", 1)[1] for arg in real if arg.startswith("--node-ip-address=")), None)
    if host is None:
        return None
    return [*command, f"--host={host}", f"--port-flag={port_flag}", "--", *real]


def lean_raylet_command(command: list[str]) -> list[str]:
    """The raylet's command with each agent's replaced by its stand-in's; unchanged where an
    agent's command is missing or lacks what the stand-in needs."""
    lean = list(command)
    for index, arg in enumerate(command):
        flag = next((flag for flag in _PORTS if arg.startswith(flag)), None)
        if flag is None:
            continue
        ports, port_flag = _PORTS[flag]
        standin = _standin(shlex.split(arg[len(flag) :]), ports, port_flag)
        if standin is None:
            logger.warning("the raylet's %s is not as expected: Ray's agent runs", flag.strip("-="))
            return command
        # Ray joins the command as list2cmdline does; the raylet splits it as a POSIX shell would.
        lean[index] = flag + subprocess.list2cmdline(standin)
    return lean


@contextlib.contextmanager
def standing_in() -> Iterator[None]:
    """While open, a raylet started in this process runs the stand-ins."""
    try:
        from ray._private import services
    except ImportError:  # a Ray that moved it: its agents run
        yield
        return
    start = getattr(services, "start_ray_process", None)
    if start is None:
        yield
        return

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == "raylet":
            command = lean_raylet_command(command)
        return start(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process
    try:
        yield
    finally:
        services.start_ray_process = start
