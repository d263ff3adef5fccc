"""Server-sent events the way OpenAI clients expect them.

The first payload is produced *before* the response starts, so a failure before the first token
(unknown prompt format, context too long, no replica) still gets a real HTTP status. After the
headers are out, an error travels in-band as `data: {"error": ...}`, and `data: [DONE]` always
ends the stream. Keep-alive pings are SSE comments (`: ping`, every `--sse-ping-seconds` of
silence), which the openai SDK ignores; an empty `data:` event would break it.

Frames that are ready together leave in one socket write: a producer task drains the payload
stream into a queue (a Ray batch of deltas arrives without a pause in between) and the response
body joins whatever is queued into one `bytes` item, which sse-starlette sends as it is. One write
per frame cost about twice the time per frame (bench/: gateway-alone rows); joining adds no wait,
since nothing is ever held back for company. sse-starlette still owns pings, disconnect detection
and the shutdown drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from protocol.errors import EngineError, OpenAIError

log = logging.getLogger(__name__)

PING_SECONDS = 15

_DONE_FRAME = b"data: [DONE]\n\n"
_END = b""


def _frame(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping", sep="\n")


async def sse_response(payloads: AsyncIterator[str], request: Request | None = None) -> EventSourceResponse:
    """`payloads` yields JSON strings; raising before its first item raises here (-> HTTP error)."""
    first: str | None
    try:
        first = await anext(payloads)
    except StopAsyncIteration:
        first = None
    ping = PING_SECONDS if request is None else request.app.state.settings.sse_ping_s
    return EventSourceResponse(_frames(first, payloads), sep="\n", ping=ping, ping_message_factory=_ping)


async def _frames(first: str | None, payloads: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """Body chunks. sse-starlette cancels this on disconnect or shutdown; the `finally` then
    cancels the producer, whose cancellation closes the payload stream (and the Ray generator)."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def produce() -> None:
        try:
            if first is not None:
                queue.put_nowait(_frame(first))
            async for payload in payloads:
                queue.put_nowait(_frame(payload))
        except OpenAIError as exc:
            queue.put_nowait(_frame(json.dumps(exc.to_body())))
        except Exception as exc:  # after the headers, a status code can no longer be sent
            log.exception("stream failed", exc_info=exc)
            queue.put_nowait(_frame(json.dumps(EngineError(f"Stream failed: {exc}").to_body())))
        queue.put_nowait(_DONE_FRAME)
        queue.put_nowait(_END)

    producer = asyncio.create_task(produce())
    try:
        while True:
            frames = [await queue.get()]
            while not queue.empty():
                frames.append(queue.get_nowait())
            body = b"".join(frames)
            if body:
                yield body
            if frames[-1] is _END:
                return
    finally:
        if not producer.done():
            producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer
