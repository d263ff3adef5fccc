"""Pumping streams through a queue: one helper for every place a producer runs apart from its reader.

Four places need it: the replica actor (engine deltas, coalesced per Ray yield), the gateway's
fan-out of `n` sequences into one stream, the SSE body (frames that are ready together leave in
one write) and the llama.cpp engines (a decode thread feeding the event loop). Written once here,
they share one end marker, one way errors travel and one cancellation rule:

* Producers are async iterables drained by tasks (`Pump.add`), or a thread (`Pump.thread_feed`).
  The reader sees their items in the order each producer made them.
* The stream ends when every producer has ended. An exception in a producer is raised in the
  reader once the items queued before it have been read (a batch is handed out first).
* Closing the pump (leaving `async with`, or the reader's generator being closed or cancelled)
  cancels the producer tasks and waits for them, so their `finally` blocks (which close engine
  streams and Ray generators) have run when the reader's cleanup is done. A thread cannot be
  interrupted: its feed's `cancel` event is set and it is not waited for (it may be queued behind
  another request on a one-worker executor; it notices the event within one step).
* Nothing waits on a timer. `batches()` hands out the first item as soon as it arrives and then
  whatever else is already queued, so coalescing never adds latency.

The queue is unbounded by default; `maxsize` bounds it (producers then wait for room), for
backpressure. Standard library only: `server/`, `backends/cluster/` and `backends/engines/` all
import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterable, AsyncIterator
from types import TracebackType
from typing import Final, Generic, TypeVar

T = TypeVar("T")


class _End:
    """The one end marker: a producer has no more items."""

    __slots__ = ()


_END: Final = _End()


class _Failure:
    """A producer's exception on its way to the reader (wrapped, so an item that happens to be an
    exception is never mistaken for one)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Pump(Generic[T]):
    """A queue between producers and one reader. Use it as an async context manager, add
    producers, then read with `async for item in pump` or `async for batch in pump.batches(n)`."""

    def __init__(self, maxsize: int = 0) -> None:
        self._queue: asyncio.Queue[T | _End | _Failure] = asyncio.Queue(maxsize)
        self._tasks: list[asyncio.Task[None]] = []
        self._feeds: list[ThreadFeed[T]] = []
        self._open = 0  # producers whose end marker has not been read yet
        self._closed = False

    async def __aenter__(self) -> Pump[T]:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- producers ---------------------------------------------------------------------------

    def add(self, source: AsyncIterable[T]) -> None:
        """Drain `source` into the queue on a task of the running loop."""
        self._open += 1
        self._tasks.append(asyncio.create_task(self._drain(source)))

    async def _drain(self, source: AsyncIterable[T]) -> None:
        queue = self._queue
        bounded = queue.maxsize > 0
        try:
            async for item in source:
                # Unbounded: put_nowait, so a producer never yields to the loop just to enqueue.
                if bounded:
                    await queue.put(item)
                else:
                    queue.put_nowait(item)
            end: _End | _Failure = _END
        except Exception as exc:
            end = _Failure(exc)
        if bounded:
            await queue.put(end)
        else:
            queue.put_nowait(end)

    def thread_feed(self, cancel: threading.Event | None = None) -> ThreadFeed[T]:
        """A producer for code on another thread. Call from the loop's thread, before starting
        the thread. `cancel` (a new event if not given) is set when the pump closes, and is the
        thread's signal to stop; an `abort()` may share it."""
        feed = ThreadFeed(self, asyncio.get_running_loop(), cancel or threading.Event())
        self._open += 1
        self._feeds.append(feed)
        return feed

    # -- the reader --------------------------------------------------------------------------

    async def __aiter__(self) -> AsyncIterator[T]:
        """Every item, one at a time."""
        queue = self._queue
        while self._open:
            item = await queue.get()
            if isinstance(item, _End):
                self._open -= 1
            elif isinstance(item, _Failure):
                self._open = 0
                raise item.error
            else:
                yield item

    async def batches(self, limit: int | None = None) -> AsyncIterator[list[T]]:
        """Lists of items: waits for one, then takes whatever else is queued already (at most
        `limit` in all), never waiting for more. Items queued before an error or the end are
        handed out before it."""
        queue = self._queue
        while self._open:
            batch: list[T] = []
            item = await queue.get()
            while True:
                if isinstance(item, _Failure):
                    self._open = 0
                    if batch:
                        yield batch
                    raise item.error
                if isinstance(item, _End):
                    self._open -= 1
                    if not self._open:
                        break
                else:
                    batch.append(item)
                    if limit is not None and len(batch) >= limit:
                        break
                if queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                yield batch

    # -- closing -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop every producer: cancel the tasks and wait for them, signal the threads.
        Idempotent."""
        self._closed = True
        for feed in self._feeds:
            feed.cancel.set()
        if self._queue.maxsize > 0:
            self._release_waiting_producers()
        for task in self._tasks:
            if not task.done():
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _release_waiting_producers(self) -> None:
        """A bounded queue nobody reads any more: empty it so a thread blocked in `put` returns
        (and then sees the pump closed)."""
        while not self._queue.empty():
            self._queue.get_nowait()


class ThreadFeed(Generic[T]):
    """The producing end of a `Pump` for one thread. `put` and `close` may be called from any
    thread but the event loop's own (a bounded pump's `put` blocks until there is room)."""

    def __init__(self, pump: Pump[T], loop: asyncio.AbstractEventLoop, cancel: threading.Event) -> None:
        self._pump = pump
        self._loop = loop
        self.cancel = cancel
        self._ended = False

    def put(self, item: T) -> None:
        """Queue one item. Does nothing once the reader has gone."""
        self._send(item)

    def close(self, error: BaseException | None = None) -> None:
        """The end of this producer's stream, or `error` for the reader to raise. Only the first
        call counts, so a `finally` can always call it."""
        if self._ended:
            return
        self._ended = True
        self._send(_END if error is None else _Failure(error))

    def _send(self, item: T | _End | _Failure) -> None:
        pump = self._pump
        if pump._closed:
            return
        try:
            if pump._queue.maxsize > 0:
                asyncio.run_coroutine_threadsafe(pump._queue.put(item), self._loop).result()
            else:
                self._loop.call_soon_threadsafe(pump._queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is left to read
            pass
