"""Server-sent events the way OpenAI clients expect them.

The first payload is produced *before* the response starts, so a failure before the first token
(unknown prompt format, context too long, no replica) still gets a real HTTP status. After the
headers are out, an error travels in-band as `data: {"error": ...}`, and `data: [DONE]` always
ends the stream (Anthropic's streams name each event and end without a marker: `SseDialect`,
`Event`). Keep-alive pings are SSE comments (`: ping`, every `--sse-ping-seconds` of
silence), which the openai SDK ignores; an empty `data:` event would break it.

Frames that are ready together leave in one socket write: a producer task drains the payload
stream into a queue (`raygate.backends.streams.Pump`; a Ray batch of deltas arrives without a pause in
between) and the response body joins whatever is queued into one `bytes` item, which sse-starlette
sends as it is. One write
per frame cost about twice the time per frame (bench/: gateway-alone rows); joining adds no wait,
since nothing is ever held back for company. sse-starlette still owns pings, disconnect detection
and the shutdown drain.

The queue is bounded (`MAX_QUEUED_FRAMES`): a client that reads nothing blocks the socket write,
then the producer, then the Ray stream and the engine (backpressure, issue #12). Such a client is
dropped by the HTTP protocol once nothing could be written for `--stream-stall-timeout`
(`server/transport/write_stall.py`); the disconnect then closes this body like any other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NamedTuple

from fastapi import Request
from fastapi.responses import StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from raygate.backends.streams import Pump, closing
from raygate.protocol.errors import EngineError, OpenAIError
from raygate.protocol.text import one_line

log = logging.getLogger(__name__)

PING_SECONDS = 15

_DONE_FRAME = b"data: [DONE]\n\n"
# Frames that may wait for the socket; what is queued leaves in one write, so this is also the
# most one write joins.
MAX_QUEUED_FRAMES = 64


class Event(NamedTuple):
    """A named event (`event: <name>` before its `data:`), as Anthropic's streams send them.
    OpenAI's payloads stay plain strings: their frames are built exactly as before."""

    name: str
    data: str


Payload = str | Event


def _one_line(json_text: str) -> bytes:
    """A payload no line reader splits: a token holding U+2028 cut its frame in two for httpx's
    `aiter_lines()` ("Unterminated string", issue 51's chaos run); protocol/text.py."""
    return one_line(json_text).encode()


def _frame(payload: Payload) -> bytes:
    if isinstance(payload, str):
        return b"data: " + _one_line(payload) + b"\n\n"
    return b"event: " + payload.name.encode() + b"\ndata: " + _one_line(payload.data) + b"\n\n"


def ndjson_line(payload: Payload) -> bytes:
    """A newline-delimited JSON line (Ollama's streams): the payload is one JSON object."""
    return _one_line(payload if isinstance(payload, str) else payload.data) + b"\n"


@dataclass(frozen=True, slots=True)
class SseDialect:
    """What differs between the protocols' streams: the in-band error frame's payload, the
    frame that ends every stream (empty: none), and how a payload is framed (SSE's `data:`, or
    one JSON object per line for NDJSON: `ndjson_response`)."""

    error: Callable[[OpenAIError], Payload]
    done: bytes
    frame: Callable[[Payload], bytes] = _frame


OPENAI_SSE = SseDialect(error=lambda exc: json.dumps(exc.to_body()), done=_DONE_FRAME)


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping", sep="\n")


async def sse_response(
    payloads: AsyncIterator[Payload], request: Request | None = None, dialect: SseDialect = OPENAI_SSE
) -> EventSourceResponse:
    """`payloads` yields JSON strings (or named events); raising before its first item raises here
    (-> HTTP error)."""
    first: Payload | None
    try:
        first = await anext(payloads)
    except StopAsyncIteration:
        first = None
    ping = PING_SECONDS if request is None else request.app.state.settings.sse_ping_s
    return EventSourceResponse(
        _frames(first, payloads, dialect), sep="\n", ping=ping, ping_message_factory=_ping
    )


async def ndjson_response(payloads: AsyncIterator[Payload], dialect: SseDialect) -> StreamingResponse:
    """The same stream as newline-delimited JSON (`application/x-ndjson`, Ollama's): the first
    payload before the headers (a failure before it is an HTTP error), frames joined per write,
    a late failure in-band, no pings (an NDJSON reader would take one for a line). A client that
    leaves is seen at the next write, which closes the payloads as for SSE."""
    first: Payload | None
    try:
        first = await anext(payloads)
    except StopAsyncIteration:
        first = None
    return StreamingResponse(_frames(first, payloads, dialect), media_type="application/x-ndjson")


async def _frames(
    first: Payload | None, payloads: AsyncIterator[Payload], dialect: SseDialect = OPENAI_SSE
) -> AsyncIterator[bytes]:
    """Body chunks: every frame queued by the time the previous write is done, joined.
    sse-starlette cancels this on disconnect or shutdown; closing the pump then cancels the
    producer, whose cancellation closes the payload stream (and the Ray generator)."""
    async with Pump[bytes](MAX_QUEUED_FRAMES) as pump:
        pump.add(_framed(first, payloads, dialect))
        async for frames in pump.batches():
            yield b"".join(frames)


async def _framed(
    first: Payload | None, payloads: AsyncIterator[Payload], dialect: SseDialect
) -> AsyncIterator[bytes]:
    """Every SSE frame of the response: the payloads, an in-band error if the stream fails after
    the headers are out, and the dialect's end (`[DONE]`) in every case but cancellation."""
    frame = dialect.frame
    try:
        if first is not None:
            yield frame(first)
        async with closing(payloads):  # closed at a `yield` too (backpressure)
            async for payload in payloads:
                yield frame(payload)
    except OpenAIError as exc:
        yield frame(dialect.error(exc))
    except Exception as exc:  # after the headers, a status code can no longer be sent
        log.exception("stream failed", exc_info=exc)
        yield frame(dialect.error(EngineError(f"Stream failed: {exc}")))
    if dialect.done:
        yield dialect.done
