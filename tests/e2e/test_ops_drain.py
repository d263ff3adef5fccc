"""SIGTERM with streams in flight (fault test 7): /ready and new requests get 503 at once, a stream
that fits in the drain timeout finishes normally, one that does not ends with an error event +
[DONE], the Ray replicas are released and the process exits 0. A response under way when the
drain began says `Connection: close` (no client's next POST goes out on a connection
the stopping gateway is about to close).

This test needs its own gateway, since it stops it; it is small (one synthetic model) and attaches
to the session's Ray."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest
import ray

from tests.support import raw_http
from tests.support.gateway import REPO, start_gateway
from tests.support.ops import StreamReader, wait_for
from tests.support.release import release_namespace

DRAIN_CONFIG = REPO / "tests" / "configs" / "drain.yaml"
KEY = "sk-test-drain-0123456789"


NAMESPACE = "raygate-drain"


def _replicas_alive() -> list[str]:
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE and a["name"].startswith("raygate:synth-drain:")
    ]


def _send(sock: socket.socket, method: str, path: str, body: dict[str, object] | None = None) -> None:
    """One keep-alive HTTP/1.1 request on a bare socket (no client library to reconnect for us)."""
    data = json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)


@pytest.mark.slow
def test_sigterm_drains_then_exits_zero(ray_address: str, tmp_path: Path) -> None:
    gw = start_gateway(
        [
            "--config",
            str(DRAIN_CONFIG),
            "--ray-address",
            ray_address,
            "--ray-namespace",
            NAMESPACE,
            "--drain-timeout",
            "4",
            "--api-key",
            KEY,
        ],
        tmp_path / "drain.log",
    )
    pending = raw_http.connect(gw.port)
    try:
        assert len(_replicas_alive()) == 1
        # A non-streamed request under way when the drain starts, and still at its timeout (100 s
        # of tokens): its answer's head is written during the drain.
        _send(pending, "POST", "/v1/completions", {"model": "synth-drain", "prompt": "x", "max_tokens": 2000})
        # 20 tokens/s: the short stream needs ~1.5 s, the long one ~100 s.
        short = StreamReader(
            gw.url, {"model": "synth-drain", "prompt": "x", "max_tokens": 30, "stream": True}, "short"
        )
        long = StreamReader(
            gw.url, {"model": "synth-drain", "prompt": "x", "max_tokens": 2000, "stream": True}, "long"
        )
        short.headers = long.headers = {"Authorization": f"Bearer {KEY}"}
        for s in (short, long):
            s.start()
            assert s.first.wait(30) and s.status == 200, s.error
        gw.proc.terminate()
        # The signal handler runs between two event-loop steps (later on a busy machine): wait for
        # the gateway to say it drains, well within the 4 s drain timeout.
        wait_for(lambda: httpx.get(f"{gw.url}/ready", timeout=10).status_code == 503, 3, 0.02, "draining")

        ready = httpx.get(f"{gw.url}/ready", timeout=10)
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
        refused = httpx.post(
            f"{gw.url}/v1/completions",
            json={"model": "synth-drain", "prompt": "x", "max_tokens": 2},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10,
        )
        assert refused.status_code == 503 and refused.headers["connection"] == "close"
        assert refused.json()["error"]["code"] == "server_shutting_down"
        assert httpx.get(f"{gw.url}/health", timeout=10).status_code == 200  # alive while draining

        assert long.is_alive() and not any("error" in d for d in long.data), long.data[-3:]
        # The request under way is ended by the drain timeout, with `Connection: close`, and the
        # connection closes after it.
        answer = raw_http.read_response(pending)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"server_shutting_down" in answer, answer[:400]
        assert raw_http.header(answer, b"connection") == b"close", answer[:400]
        assert raw_http.read_all(pending) == b""

        short.join(30)
        assert (
            short.data[-1] == "[DONE]"
            and json.loads(short.data[-2])["choices"][0]["finish_reason"] == "length"
        )
        long.join(60)
        assert not long.is_alive(), "a stream outlived the drain"
        assert long.data[-1] == "[DONE]"
        assert json.loads(long.data[-2])["error"]["code"] == "server_shutting_down"
        assert 1 < len(long.data) - 2 < 2000
        code = gw.proc.wait(60)
    finally:
        pending.close()
        code = gw.stop()
    assert code == 0, gw.log()[-3000:]
    log = gw.log()
    assert "draining" in log and "drain timeout: ending 2 request(s)" in log
    # Attached to a cluster, the drained gateway leaves the shared replicas to the controller.
    assert len(_replicas_alive()) == 1
    release_namespace(NAMESPACE)
