"""`raygate.backends.streams.Pump`: the one queue pump behind the replica's coalescing, the fan-out of `n`
sequences, the SSE body and the llama.cpp decode thread. No Ray, no model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from raygate.backends.streams import Pump


async def _items(values: list[int], fail: BaseException | None = None) -> AsyncIterator[int]:
    for v in values:
        yield v
    if fail is not None:
        raise fail


async def test_items_arrive_in_order_and_the_stream_ends() -> None:
    async with Pump[int]() as pump:
        pump.add(_items(list(range(100))))
        assert [x async for x in pump] == list(range(100))


async def test_batches_take_what_is_queued_up_to_the_limit() -> None:
    async with Pump[int]() as pump:
        pump.add(_items(list(range(10))))  # all queued in one step of the producer
        assert [b async for b in pump.batches(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


async def test_unlimited_batches_join_everything_queued() -> None:
    async with Pump[int]() as pump:
        pump.add(_items(list(range(10))))
        assert [b async for b in pump.batches()] == [list(range(10))]


async def test_the_first_item_leaves_at_once_without_waiting_for_company() -> None:
    release = asyncio.Event()

    async def slow() -> AsyncIterator[int]:
        yield 1
        await release.wait()
        yield 2

    async with Pump[int]() as pump:
        pump.add(slow())
        batches = pump.batches(64)
        assert await asyncio.wait_for(anext(batches), 1) == [1]  # not held back for item 2
        release.set()
        assert await anext(batches) == [2]
        with pytest.raises(StopAsyncIteration):
            await anext(batches)


async def _trickle(values: list[int], fail: BaseException | None = None) -> AsyncIterator[int]:
    """One item per step of the loop and a little more: items that arrive apart, not queued at once."""
    for v in values:
        yield v
        await asyncio.sleep(0.01)
    if fail is not None:
        raise fail


async def test_without_an_interval_items_that_arrive_apart_leave_apart() -> None:
    async with Pump[int]() as pump:
        pump.add(_trickle([1, 2, 3, 4, 5]))
        assert [b async for b in pump.batches(64)] == [[1], [2], [3], [4], [5]]


async def test_an_interval_gathers_what_arrives_within_it_and_never_holds_the_last_item() -> None:
    """The first item leaves at once; the rest arrive apart within the (long) interval and leave
    together, as soon as the last one is there: `wait_for` fails long before 30 s if it is held."""
    async with Pump[int]() as pump:
        pump.add(_trickle([1, 2, 3, 4, 5]))

        async def read() -> list[list[int]]:
            return [b async for b in pump.batches(64, interval=30, last=lambda x: x == 5)]

        assert await asyncio.wait_for(read(), 10) == [[1], [2, 3, 4, 5]]


async def test_an_interval_never_holds_the_end_or_an_error() -> None:
    async with Pump[int]() as pump:
        pump.add(_trickle([1, 2, 3]))

        async def read() -> list[list[int]]:
            return [b async for b in pump.batches(64, interval=30)]

        assert await asyncio.wait_for(read(), 10) == [[1], [2, 3]]  # the end released [2, 3]
    async with Pump[int]() as pump:
        pump.add(_trickle([1, 2, 3], ValueError("boom")))
        got: list[list[int]] = []

        async def read_until_error() -> None:
            async for b in pump.batches(64, interval=30):
                got.append(b)

        with pytest.raises(ValueError, match="boom"):
            await asyncio.wait_for(read_until_error(), 10)
        assert got == [[1], [2, 3]]


async def test_a_callable_interval_is_asked_after_each_batch() -> None:
    """An interval may change from batch to batch: a batch waits for what the callable says
    once the batch before it has left (none after the first two, then 30 s: the rest leaves
    together with the last)."""
    asked: list[float] = []

    def interval() -> float:
        asked.append(0.0 if len(asked) < 2 else 30.0)
        return asked[-1]

    async with Pump[int]() as pump:
        pump.add(_trickle([1, 2, 3, 4, 5]))

        async def read() -> list[list[int]]:
            return [b async for b in pump.batches(64, interval, last=lambda x: x == 5)]

        assert await asyncio.wait_for(read(), 10) == [[1], [2], [3], [4, 5]]
    assert asked == [0.0, 0.0, 30.0, 30.0]


async def test_an_interval_still_hands_out_a_full_batch_at_once() -> None:
    async with Pump[int]() as pump:
        pump.add(_trickle(list(range(7))))

        async def read() -> list[list[int]]:
            return [b async for b in pump.batches(3, interval=30, last=lambda x: x == 6)]

        assert await asyncio.wait_for(read(), 10) == [[0], [1, 2, 3], [4, 5, 6]]


async def test_several_producers_end_when_all_have_ended() -> None:
    async with Pump[int]() as pump:
        pump.add(_items([1, 2, 3]))
        pump.add(_items([]))
        pump.add(_items([10, 20]))
        got = [x async for x in pump]
    assert sorted(got) == [1, 2, 3, 10, 20]
    assert [x for x in got if x < 10] == [1, 2, 3]  # each producer's own order is kept


async def test_no_producer_is_an_empty_stream() -> None:
    async with Pump[int]() as pump:
        assert [x async for x in pump] == []


async def test_an_error_is_raised_after_the_items_before_it() -> None:
    async with Pump[int]() as pump:
        pump.add(_items([1, 2], ValueError("boom")))
        got: list[int] = []
        with pytest.raises(ValueError, match="boom"):
            async for x in pump:
                got.append(x)
    assert got == [1, 2]


async def test_a_batch_goes_out_before_the_error_that_follows_it() -> None:
    async with Pump[int]() as pump:
        pump.add(_items([1, 2], KeyError("k")))
        batches = pump.batches(64)
        assert await anext(batches) == [1, 2]
        with pytest.raises(KeyError):
            await anext(batches)


async def test_an_item_that_is_an_exception_is_just_an_item() -> None:
    async def errors() -> AsyncIterator[Exception]:
        yield ValueError("data, not a failure")

    async with Pump[Exception]() as pump:
        pump.add(errors())
        got = [x async for x in pump]
    assert len(got) == 1 and isinstance(got[0], ValueError)


class _Watched:
    """A producer that records whether it was cancelled and whether its cleanup finished."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False
        self.cleaned_up = False

    async def stream(self) -> AsyncIterator[int]:
        try:
            yield 1
            self.started.set()
            await asyncio.Event().wait()  # forever
            yield 2
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits (as closing a Ray stream does)
            self.cleaned_up = True


async def test_leaving_early_cancels_the_producer_and_waits_for_its_cleanup() -> None:
    watched = _Watched()
    async with Pump[int]() as pump:
        pump.add(watched.stream())
        async for x in pump:
            assert x == 1
            await watched.started.wait()
            break
    assert watched.cancelled and watched.cleaned_up


async def test_closing_the_readers_generator_closes_the_producer() -> None:
    watched = _Watched()

    async def reader() -> AsyncIterator[list[int]]:  # as the replica's `_batches`
        async with Pump[int]() as pump:
            pump.add(watched.stream())
            async for batch in pump.batches(64):
                yield batch

    gen = reader()
    assert await anext(gen) == [1]
    await watched.started.wait()
    await gen.aclose()  # type: ignore[attr-defined]
    assert watched.cancelled and watched.cleaned_up


async def test_cancelling_the_reader_cancels_the_producer() -> None:
    watched = _Watched()

    async def read() -> None:
        async with Pump[int]() as pump:
            pump.add(watched.stream())
            async for _ in pump:
                pass

    task = asyncio.create_task(read())
    await watched.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert watched.cancelled and watched.cleaned_up


async def test_an_error_in_one_producer_stops_the_others() -> None:
    watched = _Watched()
    async with Pump[int]() as pump:
        pump.add(watched.stream())
        await watched.started.wait()
        pump.add(_items([], RuntimeError("one failed")))
        with pytest.raises(RuntimeError):
            async for _ in pump:
                pass
    assert watched.cancelled and watched.cleaned_up


async def test_a_bounded_pump_holds_its_producer_back() -> None:
    produced: list[int] = []

    async def counted() -> AsyncIterator[int]:
        for i in range(20):
            produced.append(i)
            yield i

    async with Pump[int](maxsize=2) as pump:
        pump.add(counted())
        got = []
        async for x in pump:
            got.append(x)
            assert len(produced) - len(got) <= 3  # queue (2) + the one waiting to be put
    assert got == list(range(20))


# -- a thread as the producer (the llama.cpp decode thread) ---------------------------------------


async def test_a_thread_feeds_items_in_order() -> None:
    async with Pump[int]() as pump:
        feed = pump.thread_feed()

        def work() -> None:
            for i in range(500):
                feed.put(i)
            feed.close()

        thread = threading.Thread(target=work)
        thread.start()
        assert [x async for x in pump] == list(range(500))
        thread.join()


async def test_a_threads_error_reaches_the_reader_once() -> None:
    async with Pump[int]() as pump:
        feed = pump.thread_feed()

        def work() -> None:
            feed.put(1)
            try:
                raise ValueError("decode failed")
            except ValueError as exc:
                feed.close(exc)
            finally:
                feed.close()  # a `finally` may always close: only the first counts

        threading.Thread(target=work).start()
        got = []
        with pytest.raises(ValueError, match="decode failed"):
            async for x in pump:
                got.append(x)
    assert got == [1]


async def test_closing_the_pump_signals_the_thread_and_drops_its_later_items() -> None:
    cancel = threading.Event()  # shared with an engine's `abort()`
    stopped = threading.Event()
    async with Pump[int]() as pump:
        feed = pump.thread_feed(cancel)
        assert feed.cancel is cancel

        def work() -> None:
            i = 0
            while not cancel.is_set():
                feed.put(i)
                i += 1
                cancel.wait(0.001)
            feed.put(-1)  # after the reader left: dropped, no error
            feed.close()
            stopped.set()

        threading.Thread(target=work).start()
        async for x in pump:
            if x == 3:
                break
    assert cancel.is_set()
    assert await asyncio.to_thread(stopped.wait, 5)


async def test_a_bounded_thread_feed_blocks_and_is_released_by_close() -> None:
    blocked = threading.Event()
    done = threading.Event()
    async with Pump[int](maxsize=1) as pump:
        feed = pump.thread_feed()

        def work() -> None:
            for i in range(100):
                if i == 2:  # 0 was read, 1 fills the queue: this put waits
                    blocked.set()
                feed.put(i)  # blocks while the queue is full
            feed.close()
            done.set()

        threading.Thread(target=work).start()
        batches = pump.batches()
        first = await anext(batches)
        assert first == [0]
        assert await asyncio.to_thread(blocked.wait, 5)
        assert not done.is_set()  # held back: nobody reads
    assert await asyncio.to_thread(done.wait, 5)  # closing released it


async def test_a_blocked_thread_sees_its_cancel_event_without_the_pump_closing() -> None:
    """An engine's `abort()` sets the event while the reader is stalled: the thread stops waiting,
    and the few items it still sends (the final delta, the end) reach the reader when it resumes."""
    cancel = threading.Event()
    blocked = threading.Event()
    done = threading.Event()
    async with Pump[int](maxsize=2) as pump:
        feed = pump.thread_feed(cancel)

        def work() -> None:
            i = 0
            while not cancel.is_set():
                if i == 2:
                    blocked.set()
                feed.put(i)
                i += 1
            feed.put(-1)  # "aborted": past the bound, since the thread was cancelled
            feed.close()
            done.set()

        threading.Thread(target=work).start()
        assert await asyncio.to_thread(blocked.wait, 5)
        await asyncio.sleep(0.05)
        assert not done.is_set()  # held back while nobody reads
        cancel.set()
        assert await asyncio.to_thread(done.wait, 5)
        got = [x async for x in pump]
    assert got[-1] == -1
    assert got[:-1] == list(range(len(got) - 1))
    assert len(got) <= 4  # the bound (2), the put that was waiting, the final item


async def test_a_non_blocking_feed_says_full_instead_of_waiting() -> None:
    async with Pump[int](maxsize=2) as pump:
        feed = pump.thread_feed(block=False)
        assert not feed.full

        def work() -> None:
            for i in range(3):  # never waits, even past the bound
                feed.put(i)

        await asyncio.to_thread(work)
        assert feed.full
        batches = pump.batches()
        assert await anext(batches) == [0, 1, 2]
        assert not feed.full  # the reader took them: room again
        feed.close()
        assert [b async for b in batches] == []


async def test_the_room_is_given_back_item_by_item() -> None:
    async with Pump[int](maxsize=3) as pump:
        feed = pump.thread_feed(block=False)
        await asyncio.to_thread(lambda: [feed.put(i) for i in range(3)])
        assert feed.full
        items = aiter(pump)
        assert await anext(items) == 0
        assert not feed.full
        feed.close()
        assert [x async for x in items] == [1, 2]


async def test_a_pump_is_fed_by_tasks_or_by_threads() -> None:
    async with Pump[int](maxsize=2) as pump:
        pump.thread_feed().close()
        with pytest.raises(RuntimeError, match="not both"):
            pump.add(_items([1]))
    async with Pump[int]() as pump:
        pump.add(_items([1]))
        with pytest.raises(RuntimeError, match="not both"):
            pump.thread_feed()
        assert [x async for x in pump] == [1]


async def test_a_producer_cancelled_while_waiting_for_room_is_closed_before_aclose_returns() -> None:
    """The reader stopped (the queue is full), then left: the source sits at a `yield`, where the
    cancellation never reaches it. Its `finally` (closing a Ray stream, an engine request) must
    have run when the pump's `aclose()` returns, not whenever it is garbage-collected."""
    cleaned: list[str] = []

    async def endless() -> AsyncIterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            cleaned.append("closed")

    source = endless()
    pump = Pump[int](maxsize=2)
    pump.add(source)
    items = aiter(pump)
    assert await anext(items) == 0
    for _ in range(5):  # let the producer fill the queue and wait for room
        await asyncio.sleep(0)
    await pump.aclose()
    assert cleaned == ["closed"]


async def test_closing_a_wrapper_at_its_yield_closes_what_it_wraps() -> None:
    from raygate.backends.streams import closing

    cleaned: list[str] = []

    async def inner() -> AsyncIterator[int]:
        try:
            for i in range(10):
                yield i
        finally:
            cleaned.append("inner")

    async def wrapper() -> AsyncIterator[int]:
        async with closing(inner()) as source:
            async for x in source:
                yield x

    outer = wrapper()
    assert await anext(outer) == 0
    await outer.aclose()  # at its `yield`: plain `async for` would leave `inner` open
    assert cleaned == ["inner"]
