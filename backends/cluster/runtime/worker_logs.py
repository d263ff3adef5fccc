"""The replicas' output in the gateway's log, read by a thread of the gateway instead of Ray's
log monitor (a ~80 MB Python process that imports Ray) when Raygate starts the cluster itself.

Ray redirects every worker's stdout and stderr into `<session>/logs/worker-*.out|.err`; its log
monitor tails them (and the raylet's and GCS's `.err`, where crashes are written) and publishes
each line for the driver to print as `(ModelWorker pid=123) line`. On an embedded single node the
gateway is the only driver and the files are on its own disk, so it reads them directly and
prints the same way: a worker's stdout to stdout, the rest to stderr. A cluster Raygate attaches
to keeps Ray's own arrangement.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

POLL_S = 0.25
MAX_BYTES_PER_READ = 1 << 20  # a worker that floods its output is followed a megabyte at a time
# Ray's markers in a worker's output (ray_constants.LOG_PREFIX_*): who runs there, not output.
_ACTOR_NAME, _TASK_NAME = ":actor_name:", ":task_name:"
_MARKERS = (":job_id:", _ACTOR_NAME, _TASK_NAME)
_WORKER = re.compile(r"worker-[0-9a-f]+-[0-9a-f]+-(?P<pid>\d+)\.(?P<stream>out|err)$")
_SYSTEM = re.compile(r"(?P<name>raylet|gcs_server)(\.\d+)?\.err$")


@dataclass
class _Followed:
    handle: BinaryIO
    source: str  # "pid=123" or "raylet"
    to_stdout: bool
    name: str = ""
    partial: bytes = field(default=b"")


class WorkerLogs:
    """`start()` follows the files of `logs_dir` from where they end now (what was written before
    is in the files); `stop()` reads what is left and ends the thread."""

    def __init__(self, logs_dir: Path, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self._dir = logs_dir
        self._stdout, self._stderr = stdout, stderr
        self._files: dict[Path, _Followed] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raygate-worker-logs", daemon=True)

    def start(self) -> None:
        self._discover(at_end=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for followed in self._files.values():
            followed.handle.close()
        self._files.clear()

    def _run(self) -> None:
        while not self._stopped.wait(POLL_S):
            self.poll()
        self.poll()

    def poll(self) -> None:
        """One pass: new files found, new complete lines of every file printed."""
        self._discover(at_end=False)
        for path, followed in list(self._files.items()):
            try:
                chunk = followed.handle.read(MAX_BYTES_PER_READ)
            except OSError:
                chunk = b""
            if chunk:
                self._print(followed, chunk)
            elif not path.exists():  # the session was cleaned up
                followed.handle.close()
                del self._files[path]

    def _discover(self, at_end: bool) -> None:
        with contextlib.suppress(OSError):
            for path in self._dir.iterdir():
                if path in self._files:
                    continue
                if worker := _WORKER.match(path.name):
                    source, to_stdout = f"pid={worker['pid']}", worker["stream"] == "out"
                elif system := _SYSTEM.match(path.name):
                    source, to_stdout = system["name"], False
                else:
                    continue
                with contextlib.suppress(OSError):
                    handle = path.open("rb")
                    if at_end:
                        handle.seek(0, 2)
                    self._files[path] = _Followed(handle, source, to_stdout)

    def _print(self, followed: _Followed, chunk: bytes) -> None:
        lines = (followed.partial + chunk).split(b"\n")
        followed.partial = lines.pop()
        out = (self._stdout or sys.stdout) if followed.to_stdout else (self._stderr or sys.stderr)
        printed = []
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if line.startswith(_MARKERS):
                if line.startswith(_ACTOR_NAME):
                    followed.name = line[len(_ACTOR_NAME) :]
                continue
            who = f"{followed.name} {followed.source}" if followed.name else followed.source
            printed.append(f"({who}) {line}\n")
        if printed:
            with contextlib.suppress(ValueError, OSError):  # a closed stream at exit
                out.write("".join(printed))
                out.flush()
