"""What the raylet of an embedded cluster runs in place of Ray's agents (`agents.py`): a ~10 MB
process of the standard library alone, where each agent is a ~80-105 MB Python process that
imports much of Ray.

Run as a file (`python -I -S agent_standin.py --ports=... --session-dir=... --node-id=... [-- AGENT...]`),
never imported: it must start without Ray or Raygate. The raylet waits for its agents' port files
and fate-shares with them, so this writes the files and lives as long as the raylet:

* without a command after `--` (the dashboard agent: it exports Ray's metrics and serves the
  dashboard's node views, neither used by Raygate) every port is written as -1, Ray's own value
  for "not served" (what its minimal agent writes);
* with one (the runtime-env agent: needed only for an actor started with a `runtime_env`) the
  first port is a listening socket; the first connection to it (the raylet's, asking for a
  runtime env) replaces this process with the real agent on that port (`exec`: the same pid, so
  the raylet's watch on it holds). The pending connection is refused; the raylet retries its
  call until the agent answers (~2 s).

Either way it exits when the raylet does: the raylet holds the other end of its stdin, which
reads end-of-file then (the real agents watch the same pipe).
"""

from __future__ import annotations

import os
import select
import socket
import sys

NOT_SERVED = -1


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    own, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    options = dict(arg[2:].split("=", 1) for arg in own if arg.startswith("--") and "=" in arg)
    return options, command


def _persist(session_dir: str, node_id: str, name: str, port: int) -> None:
    """Ray's port file (`ray._raylet.persist_port`): `<name>_<node id>` holding the port, written
    whole (rename) because the raylet polls for it."""
    path = os.path.join(session_dir, f"{name}_{node_id}")
    partial = os.path.join(session_dir, f".{name}_{node_id}.{os.getpid()}")
    with open(partial, "w") as out:
        out.write(str(port))
    os.replace(partial, path)


def _listener(host: str) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(16)
    return sock


def _raylet_gone(stdin: int) -> bool:
    """The raylet writes nothing on our stdin: readable means end-of-file, or no pipe at all."""
    try:
        return os.read(stdin, 1) == b""
    except OSError:
        return True


def main(argv: list[str]) -> int:
    options, command = _options(argv)
    names = [name for name in options["ports"].split(",") if name]
    session_dir, node_id = options["session-dir"], options["node-id"]
    sock = _listener(options.get("host", "127.0.0.1")) if command else None
    for index, name in enumerate(names):
        port = sock.getsockname()[1] if sock is not None and index == 0 else NOT_SERVED
        _persist(session_dir, node_id, name, port)
    stdin = sys.stdin.fileno()
    watched = [stdin] + ([sock] if sock is not None else [])
    while True:
        ready, _, _ = select.select(watched, [], [])
        if stdin in ready and _raylet_gone(stdin):
            return 0
        if sock is not None and sock in ready:
            port = sock.getsockname()[1]
            sock.close()  # the pending connection is refused; the raylet calls again
            real = [arg for arg in command if not arg.startswith(f"--{options['port-flag']}=")]
            real.append(f"--{options['port-flag']}={port}")
            os.execv(real[0], real)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
