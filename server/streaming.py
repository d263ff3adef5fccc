"""Server-sent events the way OpenAI clients expect them.

The first payload is produced *before* the response starts, so a failure before the first token
(unknown prompt format, context too long, no replica) still gets a real HTTP status. After the
headers are out, an error travels in-band as `data: {"error": ...}`, and `data: [DONE]` always
ends the stream. Keep-alive pings are SSE comments, which the openai SDK ignores.

Frames that are ready together leave in one socket write: a producer task drains the payload
stream into a queue (a Ray batch of deltas arrives without a pause in between), and the response
joins whatever is queued. Measured with bench/, one write per frame through sse-starlette cost
~2x the time per frame; joining adds no wait, since nothing is ever held back for company.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

from protocol.errors import EngineError, OpenAIError

log = logging.getLogger(__name__)

PING_SECONDS = 15
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}

_DONE_FRAME = b"data: [DONE]\n\n"
_PING_FRAME = b": ping\n\n"
_END = b""


def _frame(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


async def sse_response(payloads: AsyncIterator[str]) -> StreamingResponse:
    """`payloads` yields JSON strings; raising before its first item raises here (-> HTTP error)."""
    first: str | None
    try:
        first = await anext(payloads)
    except StopAsyncIteration:
        first = None
    return StreamingResponse(_frames(first, payloads), media_type="text/event-stream", headers=SSE_HEADERS)


async def _frames(first: str | None, payloads: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """Body chunks of the response. Starlette cancels this when the client disconnects; the
    `finally` then cancels the producer, which closes the payload stream (and the Ray generator)."""
    loop = asyncio.get_running_loop()
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

    def ping() -> None:
        nonlocal ping_handle
        queue.put_nowait(_PING_FRAME)
        ping_handle = loop.call_later(PING_SECONDS, ping)

    producer = asyncio.create_task(produce())
    ping_handle = loop.call_later(PING_SECONDS, ping)
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
        ping_handle.cancel()
        if not producer.done():
            producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer
