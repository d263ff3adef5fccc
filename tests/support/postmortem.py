"""What to say when pytest itself dies (a signal, not a failed test): `make test` runs this after
an abnormal exit, so the end of a CI log names the test that was running and the fatal lines of
the session's Ray (its driver in this process calls abort() on some failures, and the Python
stacks faulthandler prints then do not say why).

The running test and the session's Ray folder are written to RUN_FILE by tests/conftest.py (every tier).
"""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

RUN_FILE = Path(__file__).resolve().parent.parent.parent / ".pytest_cache" / "raygate-run.json"
# Ray's fatal log lines: level C (RAY_CHECK) or F, and the driver's "will terminate".
_FATAL = re.compile(r"^\[[^\]]* [CF] \d+ \d+\]|Check failed|will terminate|unavailable for more than")


def record(**fields: str) -> None:
    """Merge `fields` into RUN_FILE (cheap enough for every test start)."""
    try:
        current = json.loads(RUN_FILE.read_text())
    except (OSError, ValueError):
        current = {}
    current.update(fields)
    RUN_FILE.parent.mkdir(parents=True, exist_ok=True)
    RUN_FILE.write_text(json.dumps(current))


def fatal_lines(session_dir: Path, limit: int = 12) -> list[str]:
    found: list[str] = []
    for log in sorted(session_dir.glob("logs/*")):
        if not log.is_file() or log.suffix not in {".log", ".out", ".err"}:
            continue
        for line in log.read_text(errors="replace").splitlines():
            if _FATAL.search(line):
                found.append(f"{log.name}: {line[:400]}")
    return found[-limit:]


def report(code: int) -> list[str]:
    if code <= 128:
        return []
    try:
        run = json.loads(RUN_FILE.read_text())
    except (OSError, ValueError):
        run = {}
    try:
        how = signal.Signals(code - 128).name
    except ValueError:
        how = f"exit {code}"
    lines = [f"pytest died ({how}) while running: {run.get('test', 'no test yet (set-up)')}"]
    if session := run.get("ray_session"):
        fatal = fatal_lines(Path(session))
        lines.append(f"The session's Ray ({session}): " + ("its fatal lines:" if fatal else "no fatal line."))
        lines += fatal
    return lines


if __name__ == "__main__":
    rc = int(sys.argv[1])
    for line in report(rc):
        print(line, file=sys.stderr)
    sys.exit(rc)
