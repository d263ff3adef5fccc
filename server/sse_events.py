"""Server-sent events with an `event:` name per frame, for protocols that type their events (the
Responses API): `event: response.output_text.delta` then `data: {...}`, and no `data: [DONE]`.

It keeps what `server/streaming.py` does for chat: the first event is produced before the response
starts, so a failure before the first token is still an HTTP error; frames ready together leave
in one write (`Pump`); pings are SSE comments; a disconnect cancels the producer, which closes the
engine stream. What differs is that an error after the headers is the protocol's to say (its own
event types carry it), so the producer must end with its error events rather than raise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from backends.streams import Pump


class NamedEvent(Protocol):
    """A wire model whose `type` names the event (protocol/response_events.py)."""

    @property
    def type(self) -> str: ...

    def to_json(self) -> str: ...


def _frame(event: NamedEvent) -> bytes:
    return b"event: " + event.type.encode() + b"\ndata: " + event.to_json().encode() + b"\n\n"


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping", sep="\n")


async def event_stream_response(events: AsyncIterator[NamedEvent], request: Request) -> EventSourceResponse:
    """`events` raising before its first event raises here (-> HTTP error)."""
    first = await anext(events, None)
    ping = request.app.state.settings.sse_ping_s
    return EventSourceResponse(_frames(first, events), sep="\n", ping=ping, ping_message_factory=_ping)


async def _frames(first: NamedEvent | None, events: AsyncIterator[NamedEvent]) -> AsyncIterator[bytes]:
    async with Pump[bytes]() as pump:
        pump.add(_framed(first, events))
        async for frames in pump.batches():
            yield b"".join(frames)


async def _framed(first: NamedEvent | None, events: AsyncIterator[NamedEvent]) -> AsyncIterator[bytes]:
    if first is not None:
        yield _frame(first)
    async for event in events:
        yield _frame(event)
