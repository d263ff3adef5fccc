"""A gateway streams from a replica on its own node over the replica's Unix socket
(backends/cluster/routing/socket_stream.py), not through Ray: while a stream is open the replica's socket
holds one more connection, and it closes when the stream ends. Without this check a replica that
could not make its socket would fall back to Ray silently, and only the benchmark would notice.
(The two-node cluster tests cover the Ray path: there the replicas are on another node.)"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL
from tests.support.ops import wait_for

CONNECTED = "03"  # /proc/net/unix's state of a connected socket


def replica_connections() -> set[str]:
    """The inodes of connected sockets whose address is a replica's socket: the replica's end of
    each stream (the gateway's end has no address of its own). Linux's table of Unix sockets."""
    found = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[5] == CONNECTED and fields[7].endswith("/replica.sock"):
            found.add(fields[6])
    return found


def test_a_stream_from_a_replica_on_the_gateways_node_goes_over_its_socket(gateway: GatewayProcess) -> None:
    before = replica_connections()
    body = {"model": CHAT_MODEL, "prompt": "Count:", "max_tokens": 64, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert any(line.startswith("data: {") for line in lines)  # the first chunk is here
        during = replica_connections()
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    ours = during - before  # other gateways' streams may come and go meanwhile: not counted
    assert len(ours) == 1, (before, during)
    wait_for(lambda: not ours & replica_connections(), 10, 0.05, "the replica's connection to close")
