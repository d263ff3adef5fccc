"""Running the several sequences of one request (`n` samples, several prompts) as one stream.

Each sequence is its own engine request, so the router spreads them over replicas. A single
sequence takes the direct path: no task, no queue, nothing added to its latency.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from protocol.generation import Delta

_END = object()


async def merge(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave streams as their deltas arrive, tagged with the stream's index."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def drain(index: int, stream: AsyncIterator[Delta]) -> None:
        try:
            async for delta in stream:
                queue.put_nowait((index, delta))
            queue.put_nowait((index, _END))
        except Exception as exc:
            queue.put_nowait((index, exc))

    tasks = [asyncio.create_task(drain(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(streams)
        while open_streams:
            index, item = await queue.get()
            if item is _END:
                open_streams -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                assert isinstance(item, Delta)
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
