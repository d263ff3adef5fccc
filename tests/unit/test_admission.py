"""server/serving/admission.py: per-model limits, 429 + Retry-After, FIFO queueing, release."""

from __future__ import annotations

import asyncio

import pytest

from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import RateLimitError
from raygate.protocol.model_limits import ModelLimits
from raygate.protocol.model_source import ModelSource
from raygate.server.serving import admission
from raygate.server.serving.admission import Admission, ModelGate, Ticket, engine_slots


def gate(max_running: int | None = None, max_waiting: int | None = None) -> ModelGate:
    return ModelGate("m", ModelLimits(max_running=max_running, max_waiting=max_waiting))


async def test_unbounded_gate_admits_everything_at_once() -> None:
    g = gate()
    tickets = [g.enter() for _ in range(50)]
    assert g.running == 50
    assert g.waiting == 0
    assert all(t.admitted.done() for t in tickets)
    for t in tickets:
        t.release()
    assert g.running == 0


async def test_running_then_waiting_then_429_with_retry_after() -> None:
    g = gate(max_running=2, max_waiting=1)
    a, b = g.enter(), g.enter()
    c = g.enter()
    assert (g.running, g.waiting) == (2, 1)
    assert a.admitted.done()
    assert b.admitted.done()
    assert not c.admitted.done()

    with pytest.raises(RateLimitError) as info:
        g.enter()
    err = info.value
    assert err.status_code == 429
    assert err.code == "queue_full"
    assert "at capacity (2 running, 1 waiting)" in err.message
    assert err.retry_after is not None
    assert err.retry_after >= 1
    assert err.headers() == {"Retry-After": str(err.retry_after)}
    # A refusal leaves the counts alone.
    assert (g.running, g.waiting) == (2, 1)
    for t in (a, b, c):
        t.release()


async def test_max_waiting_zero_refuses_as_soon_as_running_is_full() -> None:
    g = gate(max_running=1, max_waiting=0)
    t = g.enter()
    with pytest.raises(RateLimitError):
        g.enter()
    t.release()
    g.enter().release()  # the slot is free again


async def test_max_running_without_max_waiting_queues_without_bound() -> None:
    g = gate(max_running=1)
    tickets = [g.enter() for _ in range(20)]
    assert (g.running, g.waiting) == (1, 19)
    for t in tickets:
        t.release()
    assert (g.running, g.waiting) == (0, 0)


async def test_queue_is_served_in_arrival_order() -> None:
    g = gate(max_running=1, max_waiting=3)
    first = g.enter()
    queued = [g.enter() for _ in range(3)]
    order: list[int] = []

    async def waiter(i: int) -> None:
        await queued[i].wait()
        order.append(i)

    # Start the waiters in reverse so that task scheduling order cannot explain the result.
    tasks = [asyncio.create_task(waiter(i)) for i in reversed(range(3))]
    await asyncio.sleep(0)
    assert order == []
    first.release()
    for expected in range(3):
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == list(range(expected + 1))
        assert g.running == 1
        assert g.waiting == 2 - expected
        queued[expected].release()
    await asyncio.gather(*tasks)
    assert (g.running, g.waiting) == (0, 0)


async def test_release_of_a_queued_ticket_leaves_the_queue_and_keeps_order() -> None:
    g = gate(max_running=1, max_waiting=3)
    running = g.enter()
    a, b, c = g.enter(), g.enter(), g.enter()
    b.release()  # the client gave up while queued
    assert b.admitted.cancelled()
    assert (g.running, g.waiting) == (1, 2)
    running.release()
    assert a.admitted.done()
    assert not a.admitted.cancelled()
    assert not c.admitted.done()
    a.release()
    assert c.admitted.done()
    c.release()
    assert (g.running, g.waiting) == (0, 0)


async def test_release_is_idempotent() -> None:
    g = gate(max_running=1, max_waiting=1)
    a = g.enter()
    q = g.enter()
    a.release()
    a.release()
    assert (g.running, g.waiting) == (1, 0)  # q took the slot; the second release changed nothing
    q.release()
    q.release()
    assert (g.running, g.waiting) == (0, 0)


async def test_timed_out_wait_does_not_give_up_the_place_in_the_queue() -> None:
    """`wait()` shields the future: a caller's timeout must not cancel it, or the gate would lose
    track of whether the ticket holds a slot."""
    g = gate(max_running=1, max_waiting=1)
    a = g.enter()
    q = g.enter()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.wait(), 0.01)
    assert not q.admitted.cancelled()
    assert g.waiting == 1
    a.release()
    assert q.admitted.done()
    assert await q.wait() >= 0.01  # seconds spent queued
    q.release()
    assert (g.running, g.waiting) == (0, 0)


async def test_wait_of_an_immediately_admitted_ticket_is_zero() -> None:
    g = gate(max_running=1)
    t = g.enter()
    assert await t.wait() < 0.01  # no time queued
    t.release()


@pytest.mark.parametrize(
    ("avg", "max_running", "waiting", "expected"),
    [
        (1.0, 1, 0, 1),  # never below 1 s
        (0.01, 4, 0, 1),
        (10.0, 2, 3, 20),  # 10 s x (3 waiting + this one) / 2 slots
        (2.5, 1, 1, 5),
        (1000.0, 1, 5, 60),  # capped
        (3.0, None, 0, 3),  # unbounded running counts as one slot
    ],
)
def test_retry_after_estimate(avg: float, max_running: int | None, waiting: int, expected: int) -> None:
    g = gate(max_running=max_running)
    g.avg_seconds, g.waiting = avg, waiting
    assert g.retry_after() == expected


async def test_completed_requests_pull_the_duration_average_toward_their_length() -> None:
    g = gate(max_running=1)
    assert g.avg_seconds == 1.0
    g.enter().release()  # ~0 s long: 1.0 + 0.2 * (0 - 1.0)
    assert 0.8 <= g.avg_seconds < 0.81
    # A queued ticket that gives up never ran: the average does not move.
    running = g.enter()
    queued = g.enter()
    before = g.avg_seconds
    queued.release()
    assert g.avg_seconds == before
    running.release()


async def test_on_change_sees_every_transition() -> None:
    seen: list[tuple[int, int]] = []
    g = ModelGate(
        "m", ModelLimits(max_running=1, max_waiting=1), lambda gt: seen.append((gt.running, gt.waiting))
    )
    a = g.enter()
    b = g.enter()
    with pytest.raises(RateLimitError):
        g.enter()
    a.release()
    b.release()
    assert seen == [(1, 0), (1, 1), (1, 0), (0, 0)]


async def test_admission_keeps_one_gate_per_model_and_takes_new_limits() -> None:
    changes: list[str] = []
    adm = Admission(on_change=lambda g: changes.append(g.name))
    g1 = adm.gate("a", ModelLimits(max_running=1))
    t = g1.enter()
    g2 = adm.gate("a", ModelLimits(max_running=2, max_waiting=0))
    assert g2 is g1
    assert g1.limits.max_running == 2
    assert g1.running == 1  # counts survive a limits change
    assert adm.gate("b", ModelLimits()) is not g1
    g1.enter().release()  # the raised limit applies at once
    t.release()
    assert set(adm.gates) == {"a", "b"}
    assert changes == ["a", "a", "a", "a"]


# -- batch lines on engine slots (no max_running): the slots interactive traffic leaves free --


def started(ticket: Ticket) -> Ticket:
    """An interactive request whose engine call has begun (what `ModelHandle` reports)."""
    ticket.call_started()
    return ticket


async def test_batch_lines_take_only_the_slots_interactive_traffic_leaves() -> None:
    g = gate()
    g.slots = 8
    interactive = [started(g.enter()) for _ in range(4)]
    lines = [g.enter(batch=True) for _ in range(6)]
    assert [t.admitted.done() for t in lines] == [True] * 4 + [False] * 2
    assert (g.running, g.batch_running, g.batch_waiting) == (8, 4, 2)
    # An interactive request is never held by the slots: the engine preempts a batch line for it.
    extra = started(g.enter())
    assert extra.admitted.done() and g.running == 9
    # A line ends: the next waits, since 5 interactive requests ran at once just now.
    lines[0].release()
    extra.release()
    assert not lines[4].admitted.done()
    # Another line ends: the peak (5) leaves 3 slots, 2 of which batch lines hold: one more starts.
    lines[1].release()
    assert lines[4].admitted.done() and not lines[5].admitted.done()
    for t in [*interactive, *lines]:
        t.release()
    assert (g.running, g.waiting, g.batch_running) == (0, 0, 0)


async def test_the_interactive_peak_lapses_and_batch_lines_take_the_room_it_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "PEAK_WINDOW_S", 0.05)
    g = gate()
    g.slots = 2
    a, b = started(g.enter()), started(g.enter())
    a.release()
    b.release()
    line = g.enter(batch=True)
    assert not line.admitted.done()  # 2 interactive requests ran at once a moment ago
    await asyncio.wait_for(line.wait(), 5)  # the peak lapses with no other event: a timer looks again
    assert g.batch_running == 1
    line.release()


async def test_batch_lines_wait_while_interactive_requests_wait() -> None:
    g = gate(max_running=1)
    g.slots = 4
    first = g.enter()
    queued = g.enter()
    line = g.enter(batch=True)
    first.release()
    assert queued.admitted.done() and not line.admitted.done()
    queued.release()
    assert line.admitted.done()
    line.release()


def test_engine_slots_by_backend() -> None:
    def config(backend: str, **engine: object) -> ModelConfig:
        source = None if backend == "synthetic" else ModelSource(path="m.gguf")
        return ModelConfig(name="m", backend=backend, source=source, engine=engine)  # type: ignore[arg-type]

    assert engine_slots(config("llama_cpp")) == 1
    assert engine_slots(config("llama_cpp", n_seq_max=8)) == 8
    assert engine_slots(config("vllm", max_num_seqs=16)) == 16
    assert engine_slots(config("vllm")) is None
    assert engine_slots(config("synthetic")) is None


async def test_a_closed_loops_next_request_does_not_raise_the_peak() -> None:
    """A client that sends its next request as soon as it has read the last token: the gateway
    still holds the previous request (its response is being closed) while the new one's engine
    call starts. The engine slot is free already: counted by engine calls the loop of 2 never
    runs 3 at once, so the batch keeps its 2 of 4 slots."""
    g = gate()
    g.slots = 4
    loop = [started(g.enter()) for _ in range(2)]
    lines = [g.enter(batch=True) for _ in range(3)]
    assert [t.admitted.done() for t in lines] == [True, True, False]
    for _ in range(5):
        loop[0].call_ended()  # its last token is out; the response is still being sent
        nxt = started(g.enter())
        loop[0].release()
        loop = [loop[1], nxt]
    assert g.peak == 2
    lines[0].release()
    assert lines[2].admitted.done()  # the freed line slot goes to the next line
    for t in [*loop, *lines]:
        t.release()
    assert (g.running, g.interactive_calls, g.batch_running) == (0, 0, 0)
