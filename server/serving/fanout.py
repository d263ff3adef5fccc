"""Running the several sequences of one request (`n` samples, several prompts) as one stream.

Each sequence is its own engine request, so the router spreads them over replicas. A single
sequence takes the direct path: no task, no queue, nothing added to its latency. Several share a
bounded pump, so a reader that stops stops every sequence (backpressure, issue #12).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from raygate.backends.streams import Pump, closing
from raygate.protocol.generation import Delta

# Deltas the sequences may run ahead of the reader, all together.
MAX_QUEUED_DELTAS = 64


async def merge(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave streams as their deltas arrive, tagged with the stream's index. The first error
    of any stream is raised; closing the merged stream closes every stream (`Pump`)."""
    if len(streams) == 1:
        async with closing(streams[0]) as stream:
            async for delta in stream:
                yield 0, delta
        return
    async with Pump[tuple[int, Delta]](MAX_QUEUED_DELTAS) as pump:
        for index, stream in enumerate(streams):
            pump.add(_tagged(index, stream))
        async for item in pump:
            yield item


async def _tagged(index: int, stream: AsyncIterator[Delta]) -> AsyncIterator[tuple[int, Delta]]:
    async with closing(stream) as deltas:
        async for delta in deltas:
            yield index, delta
