"""Server-sent events the way OpenAI clients expect them.

The first payload is produced *before* the response starts, so a failure before the first token
(unknown prompt format, context too long, no replica) still gets a real HTTP status. After the
headers are out, an error travels in-band as `data: {"error": ...}`, and `data: [DONE]` always
ends the stream. Keep-alive pings are SSE comments (`: ping`, every `--sse-ping-seconds` of
silence), which the openai SDK ignores; an empty `data:` event would break it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from protocol.errors import EngineError, OpenAIError

log = logging.getLogger(__name__)

PING_SECONDS = 15


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping", sep="\n")


async def sse_response(payloads: AsyncIterator[str], request: Request | None = None) -> EventSourceResponse:
    """`payloads` yields JSON strings; raising before its first item raises here (-> HTTP error)."""
    first: str | None
    try:
        first = await anext(payloads)
    except StopAsyncIteration:
        first = None

    async def events() -> AsyncIterator[dict[str, str]]:
        try:
            if first is not None:
                yield {"data": first}
            async for payload in payloads:
                yield {"data": payload}
        except OpenAIError as exc:
            yield {"data": json.dumps(exc.to_body())}
        except Exception as exc:  # after the headers, a status code can no longer be sent
            log.exception("stream failed", exc_info=exc)
            yield {"data": json.dumps(EngineError(f"Stream failed: {exc}").to_body())}
        yield {"data": "[DONE]"}

    ping = PING_SECONDS if request is None else request.app.state.settings.sse_ping_s
    return EventSourceResponse(events(), sep="\n", ping=ping, ping_message_factory=_ping)
