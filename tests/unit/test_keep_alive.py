"""The gateway's HTTP server, as `raygate serve` configures it, keeps an idle connection open past
the 5 s after which httpx, the openai SDK and most HTTP clients stop reusing one. Equal timeouts
race: the server closed the connection just as the client sent its next POST on it, which the
client saw as `ReadError('')` with no status (issue 51's silent losses), and does not retry."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from raygate.server.cli import uvicorn_config
from raygate.server.settings import Settings
from tests.support import raw_http

CLIENT_IDLE_EXPIRY_S = 5.0  # httpx's (and so the openai SDK's) default keepalive_expiry


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"n": (await request.json())["n"]})


@pytest.fixture
def server() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = Starlette(routes=[Route("/echo", _echo, methods=["POST"])])
    config = uvicorn_config(app, Settings(host="127.0.0.1", port=port, log_level="warning"))
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield port
    srv.should_exit = True
    thread.join(30)


def _post(n: int) -> bytes:
    body = b'{"n": %d}' % n
    return (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (
            len(body),
            body,
        )
    )


def test_default_keep_alive_outlasts_a_clients_idle_expiry() -> None:
    assert Settings().keep_alive_timeout_s > 2 * CLIENT_IDLE_EXPIRY_S


def test_a_connection_idle_past_5_s_still_takes_the_next_post(server: int) -> None:
    with raw_http.connect(server) as sock:
        sock.sendall(_post(1))
        assert raw_http.read_response(sock).endswith(b'{"n":1}')
        time.sleep(CLIENT_IDLE_EXPIRY_S + 1)  # a client that keeps connections a little longer
        sock.sendall(_post(2))
        answer = raw_http.read_response(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'{"n":2}')
