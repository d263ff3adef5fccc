"""Nothing of an embedded Ray cluster outlives its gateway.

`ray.init()` without an address starts a private head node (gcs_server, raylet, monitors, agents)
under the gateway. A clean stop shuts it down. A SIGKILLed gateway takes gcs_server and the raylet
with it, but Ray's dashboard and runtime-env agents are reparented and stay: about a minute here
(Ray 2.60, 2 busy cores) before they notice, and the red team (issue #12) saw them stay behind.
They are recognised by their session directory: it is on their command line or among their open
files (the agents' logs), and it is unique to one `ray.init`.

Two mechanisms, so that either alone suffices:

* a watchdog process, started with the cluster in its own session, waits for the gateway to exit
  (its end of a pipe closes however the gateway dies), then stops every process of the session:
  SIGTERM, and SIGKILL for those still there after a grace period;
* a record per embedded cluster under `$TMPDIR/raygate-<uid>/embedded/`; the next embedded start
  stops the processes of every recorded session whose gateway is gone, in case the watchdog was
  killed too.

Linux only (it reads /proc); elsewhere both are no-ops.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRACE_SECONDS = 3.0
EXIT_WAIT_SECONDS = 30.0  # a gateway that closed its end of the pipe gets this long to exit
_PROC = Path("/proc")
_watchdog: subprocess.Popen[bytes] | None = None


def records_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"raygate-{os.getuid()}" / "embedded"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid,
    it names one process, even after the pid is reused."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start_time: str | None) -> bool:
    return start_time is not None and _start_time(pid) == start_time


def session_processes(session_dir: str, spare: frozenset[int] = frozenset()) -> list[int]:
    """Processes of this user that belong to the Ray session `session_dir`: named on their command
    line, or holding a file under it open. Never this process, nor those in `spare`."""
    prefix = session_dir.rstrip("/") + "/"
    uid, found = os.getuid(), []
    spare = spare | {os.getpid()}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            if session_dir in cmdline:
                found.append(int(entry.name))
                continue
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd).startswith(prefix):
                        found.append(int(entry.name))
                        break
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def stop_session(
    session_dir: str, grace: float = GRACE_SECONDS, spare: frozenset[int] = frozenset()
) -> list[int]:
    """SIGTERM every process of the session (but those in `spare`), then SIGKILL what is left
    after `grace` seconds. Returns the pids it signalled."""
    pids = session_processes(session_dir, spare)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if (_PROC / str(p)).exists() and not _zombie(p)]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _zombie(pid: int) -> bool:
    try:
        return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def reap_stale() -> list[str]:
    """Stop the leftovers of recorded embedded clusters whose gateway is gone; returns their
    session directories."""
    reaped: list[str] = []
    folder = records_dir()
    if not _PROC.is_dir() or not folder.is_dir():
        return reaped
    for record in folder.glob("*.json"):
        try:
            info = json.loads(record.read_text())
            pid, started, session = int(info["gateway_pid"]), info["gateway_start"], str(info["session_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            record.unlink(missing_ok=True)
            continue
        if _alive(pid, started):
            continue  # another gateway, still running
        stop_session(session)
        record.unlink(missing_ok=True)
        reaped.append(session)
    return reaped


def guard(session_dir: str) -> None:
    """Record this gateway's embedded session and start its watchdog (once per process)."""
    global _watchdog  # noqa: PLW0603 - one watchdog per process, whichever app started Ray
    if not _PROC.is_dir() or _watchdog is not None:
        return
    me = os.getpid()
    folder = records_dir()
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / f"{me}.json"
    record.write_text(
        json.dumps({"gateway_pid": me, "gateway_start": _start_time(me), "session_dir": session_dir})
    )
    _watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raygate.backends.cluster.runtime.embedded",
            session_dir,
            str(record),
            str(me),
            str(_start_time(me)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the gateway's process group leaves it running
        close_fds=True,
    )


def _watch(session_dir: str, record: str, gateway_pid: int, gateway_start: str) -> None:
    """The watchdog: block until the gateway's end of stdin closes, then clean up after it.

    The pipe also closes while a gateway that stops cleanly is still finishing its exit (Python
    closes files before the process ends): wait for it to be gone, and never signal it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while _alive(gateway_pid, gateway_start) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop_session(
        session_dir, spare=frozenset({gateway_pid}) if _alive(gateway_pid, gateway_start) else frozenset()
    )
    Path(record).unlink(missing_ok=True)


if __name__ == "__main__":
    _watch(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
