"""A private PostgreSQL server for the tests: Debian's package, started in a temporary folder on a
free port, stopped (and its folder removed) at the end.

The binaries come from `postgresql` (installed by `make postgres`, a prerequisite of `make test`,
or here with apt when missing: as root, or through sudo). PostgreSQL refuses to run as root, so as
root the cluster belongs to the package's `postgres` user (`runuser`). Trust authentication on
127.0.0.1 only: the server lives as long as the test session and holds nothing but test data.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

SUPERUSER = "raygate"


def _bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (found / "initdb").exists():
            return found
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
    )
    return versions[-1].parent if versions else None


def _install() -> None:
    """Debian's postgresql, as the Makefile's `postgres` target installs it."""
    if shutil.which("apt-get") is None:
        raise RuntimeError("PostgreSQL is not installed and there is no apt-get: run `make postgres`")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "postgresql"], check=True, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    """A running server; `database()` makes a fresh, empty database and returns its URL."""

    def __init__(self, port: int) -> None:
        self.port = port

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        name = f"raygate_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')  # a name made here, not input
        return self.url(name)


@contextlib.contextmanager
def running_postgres() -> Iterator[Postgres]:
    bindir = _bindir()
    if bindir is None:
        _install()
        bindir = _bindir()
        assert bindir is not None, "apt-get installed postgresql, but no initdb was found"
    # Not under pytest's tmp_path: its parents are private to root, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="raygate-pg-"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        root.chmod(0o700)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()

    def run(*cmd: str) -> None:
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    run(str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o", options, "-w", "start")
    try:
        yield Postgres(port)
    finally:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
