"""The load client: fixed concurrency, a bounded number of streamed requests, loopback HTTP/1.1.

Written on a bare asyncio protocol with httptools' C parser (both already installed with uvicorn)
instead of httpx/aiohttp, because the client shares two cores with the server it measures: at ~10k
SSE frames/s a general-purpose client's per-frame cost would be measured as server time. Each
worker keeps one keep-alive connection, as `vllm bench serve`'s aiohttp session does. The same
client drives every HTTP target, so their ratios are fair.

Output tokens are `usage.completion_tokens` when the server sends usage (we always ask with
`stream_options.include_usage`), else the number of text-carrying chunks (llama_cpp.server sends no
usage when streaming, and one chunk per token).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools

try:  # ~5x faster than json on small chunks; installed today (aioprometheus needs it), not promised
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    from json import loads as _loads

from bench.metrics import RequestResult

REQUEST_TIMEOUT_S = 120.0
UNIQUE_MARK = "{n}"
SEED = 48  # of `Workload.max_tokens_between`'s draws
_NUMBERS = itertools.count(1)  # unique prompts' numbers: never repeated within one process


@dataclass(frozen=True, slots=True)
class Workload:
    """One request body sent again and again; `expected_tokens` marks shorter outputs failed.
    `unique`: each request's `prompt` starts with its own number, so no server can answer it
    from a prompt cache (the first tokens already differ), or has it where the prompt holds
    `UNIQUE_MARK` (after a shared opening: only that opening can come from a cache)."""

    path: str
    body: dict[str, Any]
    expected_tokens: int | None = None
    unique: bool = False
    # Each request's `max_tokens` drawn from this range (inclusive, a fixed seed), as real
    # requests' lengths differ: a closed loop of equal-length requests keeps the phase it falls
    # into, such as two clients whose requests start in the same decode for ever after.
    max_tokens_between: tuple[int, int] | None = None

    def payloads(self) -> Callable[[], bytes]:
        """The next request body, encoded."""
        if not self.unique and self.max_tokens_between is None:
            payload = json.dumps(self.body).encode()  # once: the gateway-alone rows time the client too
            return lambda: payload
        bodies = self._bodies()
        if self.max_tokens_between is None:
            return lambda: json.dumps(bodies()).encode()
        low, high = self.max_tokens_between
        draw = random.Random(SEED)
        return lambda: json.dumps({**bodies(), "max_tokens": draw.randint(low, high)}).encode()

    def _bodies(self) -> Callable[[], dict[str, Any]]:
        if not self.unique:
            return lambda: self.body
        if "prompt" not in self.body:  # chat: the last message's text carries the number
            *earlier, last = self.body["messages"]
            text = str(last["content"])
            text = text if UNIQUE_MARK in text else f"{UNIQUE_MARK}. {text}"
            return lambda: {
                **self.body,
                "messages": [*earlier, {**last, "content": text.replace(UNIQUE_MARK, str(next(_NUMBERS)))}],
            }
        prompt = str(self.body["prompt"])
        if UNIQUE_MARK not in prompt:  # the number leads: nothing of the prompt is shared
            prompt = f"{UNIQUE_MARK}. {prompt}"
        return lambda: {**self.body, "prompt": prompt.replace(UNIQUE_MARK, str(next(_NUMBERS)))}


class HttpError(Exception):
    """A non-200 answer from the target; its `status` becomes the request's failure class in the summary."""

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


class _ResponseProtocol(asyncio.Protocol):
    """One keep-alive connection. Bytes are parsed where they arrive (`data_received`), by
    httptools' C parser, and stamped with one clock reading per socket read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._done: asyncio.Future[None] | None = None
        self._result: RequestResult | None = None
        self._body = bytearray()
        self._sse = b""
        self._now = 0.0
        self.status = 0
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.stream_error = ""
        self.closed = False
        self.received = False  # any byte of the current response

    def begin(self, result: RequestResult, done: asyncio.Future[None]) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._result, self._done = result, done
        self._body.clear()
        self._sse = b""
        self.status, self.chunks, self.usage_tokens, self.stream_error = 0, 0, None, ""
        self.received = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionResetError("server closed the connection"))

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            return
        self._now = time.perf_counter()
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._done is not None and not self._done.done():
                self._done.set_exception(ConnectionResetError(f"bad HTTP response: {exc}"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            self._body += body
            return
        buffer = (self._sse + body).replace(b"\r\n", b"\n")
        *events, self._sse = buffer.split(b"\n\n")
        for raw in events:
            for line in raw.split(b"\n"):
                if line.startswith(b"data:"):
                    self._on_data(line[5:].strip())

    def _on_data(self, data: bytes) -> None:
        if data == b"[DONE]":
            return
        text, tokens, is_error = _text_of(_loads(data))
        if is_error:
            self.stream_error = data[:200].decode(errors="replace")
        if tokens is not None:
            self.usage_tokens = tokens
        if text:
            result = self._result
            assert result is not None
            self.chunks += 1
            if result.first_token is None:
                result.first_token = self._now
            result.chunk_times.append(self._now)

    def on_message_complete(self) -> None:
        assert self._parser is not None
        if not self._parser.should_keep_alive() and self.transport is not None:
            self.transport.close()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    @property
    def error_body(self) -> str:
        return bytes(self._body[:200]).decode(errors="replace")


class Connection:
    """A keep-alive HTTP/1.1 connection that streams SSE responses into `RequestResult`s."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._protocol: _ResponseProtocol | None = None

    async def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None

    async def stream(self, path: str, payload: bytes, result: RequestResult, expected: int | None) -> None:
        """One request. A kept-alive connection that the server closes before answering (llama-server
        drops one after each streamed response) is opened again and the request sent once more, as
        curl and urllib3 do: the server never saw it, so nothing is counted twice."""
        loop = asyncio.get_running_loop()
        reused = self._protocol is not None and not self._protocol.closed
        if not reused:
            _, self._protocol = await loop.create_connection(_ResponseProtocol, self._host, self._port)
        protocol = self._protocol
        assert protocol is not None and protocol.transport is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        done: asyncio.Future[None] = loop.create_future()
        protocol.begin(result, done)
        result.sent = time.perf_counter()
        protocol.transport.write(head + payload)
        try:
            await done
        except ConnectionResetError:
            if not reused or protocol.received:
                raise
            self._protocol, first_sent = None, result.sent
            await self.stream(path, payload, result, expected)
            result.sent = first_sent  # the lost attempt counts in the request's TTFT and E2E
            return
        result.end = time.perf_counter()
        if protocol.status != 200:
            raise HttpError(str(protocol.status), protocol.error_body)
        result.output_tokens = protocol.usage_tokens if protocol.usage_tokens is not None else protocol.chunks
        if protocol.stream_error:
            result.status, result.error = "stream_error", protocol.stream_error
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
    payload = workload.payloads()

    async def make() -> tuple[Runner, Callable[[], Awaitable[None]]]:
        conn = Connection(host, port)

        async def run(result: RequestResult) -> None:
            try:
                await asyncio.wait_for(
                    conn.stream(prefix + workload.path, payload(), result, workload.expected_tokens),
                    REQUEST_TIMEOUT_S,
                )
            except HttpError as exc:
                result.status, result.error = exc.status, str(exc)
            except TimeoutError:
                result.status, result.error = "timeout", f"no end after {REQUEST_TIMEOUT_S:.0f}s"
            except (OSError, ValueError) as exc:
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
