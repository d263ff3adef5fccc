"""The chaos harness tells a connection closed before any answer (HTTP/1.1's keep-alive race at a
gateway's restart, a refusal the client sees) from a body cut short (a silent loss). Judged here
against a real socket that does each."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.chaos.traffic import CLOSED, REFUSED, SILENT, broken, client_for


async def _serve(answer: bytes) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/"


async def _judge(answer: bytes) -> tuple[str, int, str | None, str]:
    server, url = await _serve(answer)
    async with server, client_for({}, httpx.Limits()) as client:
        with pytest.raises(httpx.TransportError) as info:
            await client.post(url, json={})
    return broken(info.value)


def test_a_connection_closed_before_any_answer_is_a_refusal() -> None:
    kind, _, code, _ = asyncio.run(_judge(b""))
    assert (kind, code) == (REFUSED, CLOSED)


def test_a_body_cut_short_is_silent() -> None:
    kind, status, _, detail = asyncio.run(_judge(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"id"'))
    assert kind == SILENT and status == 0, detail


def test_a_refused_connection_is_a_refusal() -> None:
    async def judge() -> tuple[str, int, str | None, str]:
        server, url = await _serve(b"")
        server.close()
        await server.wait_closed()
        async with client_for({}, httpx.Limits()) as client:
            with pytest.raises(httpx.TransportError) as info:
                await client.post(url, json={})
        return broken(info.value)

    kind, _, code, _ = asyncio.run(judge())
    assert (kind, code) == (REFUSED, "connect")
