"""The load client: fixed concurrency, a bounded number of streamed requests, loopback HTTP/1.1.

Written on bare asyncio streams instead of httpx/aiohttp because the client shares two cores with
the server it measures: at ~10k SSE frames/s a general-purpose client's per-frame cost would be
measured as server time. Each worker keeps one keep-alive connection, as `vllm bench serve`'s
aiohttp session does. The same client drives every HTTP target, so their ratios are fair.

Output tokens are `usage.completion_tokens` when the server sends usage (we always ask with
`stream_options.include_usage`), else the number of text-carrying chunks (llama_cpp.server sends no
usage when streaming, and one chunk per token).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bench.metrics import RequestResult

REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Workload:
    """One request body sent again and again; `expected_tokens` marks shorter outputs failed."""

    path: str
    body: dict[str, Any]
    expected_tokens: int | None = None


class HttpError(Exception):
    def __init__(self, status: str, message: str = "") -> None:
        super().__init__(message or status)
        self.status = status


def _text_of(event: dict[str, Any]) -> tuple[str, int | None, bool]:
    """(generated text, usage tokens if present, whether the event is an in-band error)."""
    if "error" in event:
        return "", None, True
    usage = event.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    parts = []
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if text:
            parts.append(text)
    return "".join(parts), tokens, False


class Connection:
    """One keep-alive HTTP/1.1 connection that streams SSE responses."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        self._reader = self._writer = None

    async def stream(self, path: str, payload: bytes, result: RequestResult, expected: int | None) -> None:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        result.sent = time.perf_counter()
        writer.write(head + payload)
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionResetError("server closed the connection")
        status = status_line.split(b" ", 2)[1].decode()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        keep_alive = headers.get("connection", "").lower() != "close"
        if status != "200":
            body = await self._read_body(reader, headers)
            raise HttpError(status, body[:200].decode(errors="replace"))
        await self._read_sse(reader, headers, result, expected)
        if not keep_alive:
            await self.close()

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while piece := await self._read_chunk(reader):
                parts.append(piece)
            return b"".join(parts)
        if "content-length" in headers:
            return await reader.readexactly(int(headers["content-length"]))
        data = await reader.read()
        await self.close()
        return data

    @staticmethod
    async def _read_chunk(reader: asyncio.StreamReader) -> bytes:
        size = int((await reader.readline()).split(b";", 1)[0], 16)
        data = await reader.readexactly(size + 2)  # the chunk and its CRLF
        if size == 0:
            return b""
        return data[:-2]

    async def _read_sse(
        self,
        reader: asyncio.StreamReader,
        headers: dict[str, str],
        result: RequestResult,
        expected: int | None,
    ) -> None:
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        buffer = b""
        chunks = 0
        usage_tokens: int | None = None
        stream_error = ""
        while True:
            piece = await (self._read_chunk(reader) if chunked else reader.read(65536))
            if not piece:
                break
            now = time.perf_counter()
            buffer = (buffer + piece).replace(b"\r\n", b"\n")
            *events, buffer = buffer.split(b"\n\n")
            for raw in events:
                for line in raw.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue  # comments (pings) and other fields
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue
                    text, tokens, is_error = _text_of(json.loads(data))
                    if is_error:
                        stream_error = data[:200].decode(errors="replace")
                    if tokens is not None:
                        usage_tokens = tokens
                    if text:
                        chunks += 1
                        if result.first_token is None:
                            result.first_token = now
                        result.chunk_times.append(now)
        if not chunked:
            await self.close()
        result.end = time.perf_counter()
        result.output_tokens = usage_tokens if usage_tokens is not None else chunks
        if stream_error:
            result.status, result.error = "stream_error", stream_error
        elif expected is not None and result.output_tokens < expected:
            result.status, result.error = "incomplete", f"{result.output_tokens} of {expected} tokens"
        else:
            result.ok, result.status = True, "200"


# A request runner: given a fresh result to fill, does one request.
Runner = Callable[[RequestResult], Awaitable[None]]


async def run_closed_loop(
    make_worker: Callable[[], Awaitable[tuple[Runner, Callable[[], Awaitable[None]]]]],
    *,
    concurrency: int,
    requests: int,
    max_seconds: float,
) -> tuple[list[RequestResult], float]:
    """`concurrency` workers each send their next request as soon as the last one ends, until
    `requests` were sent or `max_seconds` passed. Returns the results and the wall time."""
    results: list[RequestResult] = []
    remaining = requests
    start = time.perf_counter()
    deadline = start + max_seconds

    async def worker() -> None:
        nonlocal remaining
        run, close = await make_worker()
        try:
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                result = RequestResult(sent=time.perf_counter())
                results.append(result)
                await run(result)
        finally:
            await close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - start


def http_worker_factory(
    base_url: str, workload: Workload
) -> Callable[[], Awaitable[tuple[Runner, Callable[[], Awaitable[None]]]]]:
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    prefix = url.path.rstrip("/")
    payload = json.dumps(workload.body).encode()

    async def make() -> tuple[Runner, Callable[[], Awaitable[None]]]:
        conn = Connection(host, port)

        async def run(result: RequestResult) -> None:
            try:
                await asyncio.wait_for(
                    conn.stream(prefix + workload.path, payload, result, workload.expected_tokens),
                    REQUEST_TIMEOUT_S,
                )
            except HttpError as exc:
                result.status, result.error = exc.status, str(exc)
            except asyncio.TimeoutError:
                result.status, result.error = "timeout", f"no end after {REQUEST_TIMEOUT_S:.0f}s"
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                result.status, result.error = "connection", repr(exc)[:200]
            if not result.ok:
                result.end = None
                await conn.close()  # never reuse a connection in an unknown state

        return run, conn.close

    return make


async def run_http(
    base_url: str, workload: Workload, *, concurrency: int, requests: int, max_seconds: float
) -> tuple[list[RequestResult], float]:
    """Drive an OpenAI-compatible server at `base_url` (e.g. http://127.0.0.1:8123/v1)."""
    return await run_closed_loop(
        http_worker_factory(base_url, workload),
        concurrency=concurrency,
        requests=requests,
        max_seconds=max_seconds,
    )
