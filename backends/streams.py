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
* Nothing waits on a timer unless asked. `batches()` hands out the first item as soon as it
  arrives and then whatever else is already queued, so coalescing adds no latency; given an
  `interval`, later batches are spaced out by it (fewer, larger batches; never the last one held).

Backpressure: `maxsize` bounds the queue, so a reader that stops reading stops its producers
(issue #12: a client that read nothing let the engine produce a whole answer into gateway memory).
Task producers wait in `Queue.put`, which does not yield to the loop while there is room. A thread
waits in its feed's `put` until the reader has taken an item: a counter under a lock (`_Room`), no
round trip to the loop per item; closing the pump opens the room for good, so a blocked thread
always returns (and then sees its `cancel` event). A feed made with `block=False` never waits and
says `full` instead, for a thread that serves several streams and must not stall on one (the
batched llama.cpp scheduler pauses that stream). A pump is fed by tasks or by threads, not both.
Standard library only: `server/`, `backends/cluster/` and `backends/engines/` all import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable
from types import TracebackType
from typing import Final, Generic, TypeVar

T = TypeVar("T")
S = TypeVar("S")

# How often a thread blocked on a full feed looks at its `cancel` event (an engine's `abort()` sets
# it without closing the pump). Only a thread that is already waiting polls: the normal path never.
CANCEL_POLL_SECONDS = 0.05


async def _aclose(stream: object) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


@contextlib.asynccontextmanager
async def closing(stream: S) -> AsyncIterator[S]:
    """`async with closing(source): async for x in source: yield ...` in a wrapping generator:
    closing the wrapper at its `yield` (a reader that stopped reading, then left) closes `source`
    too. `async for` alone leaves it open until it is garbage-collected. Unlike
    `contextlib.aclosing`, any async iterable will do (one without `aclose` is left alone)."""
    try:
        yield stream
    finally:
        await _aclose(stream)


def _as_callable(value: float | Callable[[], float]) -> Callable[[], float]:
    if callable(value):
        return value
    return lambda: value


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
        self._maxsize = maxsize
        self._queue: asyncio.Queue[T | _End | _Failure] = asyncio.Queue(maxsize)
        self._room: _Room | None = None  # the bound for thread feeds (their queue is unbounded)
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
        if self._feeds:
            raise RuntimeError("a pump is fed by tasks or by threads, not both")
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
        except BaseException:
            # Cancelled while waiting for room (the reader stopped, then left): the source sits
            # at a `yield`, where the cancellation never reached it. Close it now, so its
            # `finally` blocks run before `aclose()` returns, not whenever it is collected.
            await _aclose(source)
            raise
        if bounded:
            await queue.put(end)
        else:
            queue.put_nowait(end)

    def thread_feed(self, cancel: threading.Event | None = None, *, block: bool = True) -> ThreadFeed[T]:
        """A producer for code on another thread. Call from the loop's thread, before starting
        the thread. `cancel` (a new event if not given) is set when the pump closes, and is the
        thread's signal to stop; an `abort()` may share it. On a bounded pump, `put` waits for
        room (`block=False`: it never waits; the thread reads `feed.full` and holds back)."""
        if self._tasks:
            raise RuntimeError("a pump is fed by tasks or by threads, not both")
        if self._maxsize > 0 and self._room is None:
            # The bound moves from the queue to the room: end markers must always get through.
            self._room = _Room(self._maxsize)
            self._queue = asyncio.Queue()
        feed = ThreadFeed(self, asyncio.get_running_loop(), cancel or threading.Event(), block)
        self._open += 1
        self._feeds.append(feed)
        return feed

    # -- the reader --------------------------------------------------------------------------

    async def __aiter__(self) -> AsyncIterator[T]:
        """Every item, one at a time."""
        queue, room = self._queue, self._room
        while self._open:
            item = await queue.get()
            if isinstance(item, _End):
                self._open -= 1
            elif isinstance(item, _Failure):
                self._open = 0
                raise item.error
            else:
                if room is not None:
                    room.give(1)
                yield item

    async def batches(
        self,
        limit: int | None = None,
        interval: float | Callable[[], float] = 0.0,
        last: Callable[[T], bool] | None = None,
    ) -> AsyncIterator[list[T]]:
        """Lists of items: waits for one, then takes whatever else is queued already (at most
        `limit` in all). Items queued before an error or the end are handed out before it.

        `interval` (seconds) spaces the batches out: the first leaves at once, a later one not
        before `interval` after the one before it, gathering what arrives meanwhile (vLLM's
        `stream_interval`, in time). An item for which `last` is true, an error or the end leaves
        at once with what was gathered, so the interval never delays a stream's end. A callable
        `interval` is asked after each batch (the replica's grows with its streams)."""
        queue, room = self._queue, self._room
        spacing = _as_callable(interval)
        loop = asyncio.get_running_loop()
        due = -math.inf  # when the next batch may leave
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
                    if (limit is not None and len(batch) >= limit) or (last is not None and last(item)):
                        break
                if not queue.empty():
                    item = queue.get_nowait()
                    continue
                wait = due - loop.time()
                if wait <= 0:
                    break
                try:
                    item = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    break
            if batch:
                if room is not None:
                    room.give(len(batch))
                yield batch
                due = loop.time() + spacing()

    # -- closing -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop every producer: cancel the tasks and wait for them, signal the threads.
        Idempotent."""
        self._closed = True
        for feed in self._feeds:
            feed.cancel.set()
        if self._room is not None:
            self._room.open()
        for task in self._tasks:
            if not task.done():
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _Room:
    """Free places in a bounded pump that threads feed. The reader gives places back as it takes
    items; a thread takes one per item, waiting while there is none."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._open = False  # the pump has closed: nobody waits any more

    @property
    def full(self) -> bool:
        return self._free <= 0 and not self._open

    def take(self, cancel: threading.Event, block: bool) -> None:
        """One place. Waits (if `block`) while the pump is full, the pump is open and `cancel` is
        not set: once cancelled, the few items left (the final delta, the end) go through."""
        with self._freed:
            if block:
                while self._free <= 0 and not self._open and not cancel.is_set():
                    self._freed.wait(CANCEL_POLL_SECONDS)
            self._free -= 1

    def give(self, n: int) -> None:
        with self._freed:
            self._free += n
            self._freed.notify()

    def open(self) -> None:
        with self._freed:
            self._open = True
            self._freed.notify_all()


class ThreadFeed(Generic[T]):
    """The producing end of a `Pump` for one thread. `put` and `close` may be called from any
    thread but the event loop's own (a bounded pump's `put` waits for room unless the feed was
    made with `block=False`)."""

    def __init__(
        self, pump: Pump[T], loop: asyncio.AbstractEventLoop, cancel: threading.Event, block: bool = True
    ) -> None:
        self._pump = pump
        self._loop = loop
        self.cancel = cancel
        self._block = block
        self._ended = False

    @property
    def full(self) -> bool:
        """The reader is behind by the pump's whole bound: a non-blocking producer holds back."""
        room = self._pump._room
        return room is not None and room.full

    def put(self, item: T) -> None:
        """Queue one item (waiting for room on a bounded pump). Does nothing once the reader has
        gone."""
        room = self._pump._room
        if room is not None:
            room.take(self.cancel, self._block)
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
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is left to read
            self._loop.call_soon_threadsafe(pump._queue.put_nowait, item)
