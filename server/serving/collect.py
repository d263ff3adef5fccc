"""Gathering a non-streamed answer while watching for the client to leave."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import Request

from raygate.protocol.generation import Delta
from raygate.server.serving.tally import Tally

log = logging.getLogger(__name__)

# nginx's status for "client closed request": what the access log and metrics record when the
# client left before a non-streamed answer was ready (nobody receives it).
CLIENT_CLOSED_REQUEST = 499


async def collect(request: Request, deltas: AsyncIterator[tuple[int, Delta]]) -> Tally | None:
    """A whole non-streamed answer, or None if the client disconnected first.

    Reading stops when the client goes: the read is cancelled, which closes the engine streams
    (and their Ray generators), so the engines abort instead of decoding to `max_tokens` for
    nobody. A streamed answer gets the same from sse-starlette's disconnect watch.
    """
    tally = Tally()

    async def read() -> Tally:
        async for index, delta in deltas:
            tally.add(index, delta)
        return tally

    reading = asyncio.create_task(read())
    watching = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait((reading, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not reading.done():
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
    if reading.cancelled():
        log.info("client disconnected before the answer was complete; its engine requests were aborted")
        return None
    return reading.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
