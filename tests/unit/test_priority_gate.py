"""server/serving/admission.py's priority classes: vLLM's `priority` orders the waiting
interactive requests (lower first, arrival breaks ties), and batch lines come after all of them,
never start while an interactive request waits, and are never refused. A key's `priority` is
its requests' default."""

from __future__ import annotations

from pathlib import Path

import pytest

from raygate.protocol.errors import RateLimitError
from raygate.protocol.model_limits import ModelLimits
from raygate.server.access.auth import KeyStore
from raygate.server.serving.admission import ModelGate, Ticket


def gate(max_running: int | None = 1, max_waiting: int | None = None) -> ModelGate:
    return ModelGate("m", ModelLimits(max_running=max_running, max_waiting=max_waiting))


def started(tickets: list[Ticket]) -> list[bool]:
    return [t.admitted.done() and not t.admitted.cancelled() for t in tickets]


async def test_waiting_requests_start_by_priority_then_arrival() -> None:
    g = gate()
    running = g.enter()
    queued = [g.enter(priority=5), g.enter(priority=-1), g.enter(priority=5), g.enter(priority=0)]
    order: list[int] = []
    for _ in queued:
        running.release()
        (running,) = [t for t in queued if t.admitted.done() and not t.released]
        order.append(queued.index(running))
    running.release()
    assert order == [1, 3, 0, 2]
    assert (g.running, g.waiting) == (0, 0)


async def test_batch_lines_wait_behind_every_interactive_request() -> None:
    g = gate()
    holder = g.enter()
    line = g.enter(priority=-100, batch=True)  # a batch line's own priority does not lift it
    late = g.enter(priority=50)
    assert (g.waiting, g.batch_waiting, g.interactive_waiting) == (2, 1, 1)
    holder.release()
    assert started([line, late]) == [False, True]
    late.release()
    assert started([line]) == [True]
    line.release()
    assert (g.running, g.waiting, g.batch_waiting) == (0, 0, 0)


async def test_a_batch_line_does_not_start_while_an_interactive_request_waits() -> None:
    g = gate(max_running=2)
    a, b = g.enter(), g.enter()
    waiting = g.enter()
    a.release()  # the waiting request takes the slot
    assert waiting.admitted.done()
    c = g.enter()  # and another one waits again
    line = g.enter(batch=True)
    b.release()  # the freed slot goes to the interactive request, not the line
    assert started([c, line]) == [True, False]
    for t in (waiting, c):
        t.release()
    assert started([line]) == [True]
    line.release()


async def test_batch_lines_never_get_429_nor_fill_the_interactive_queue() -> None:
    g = gate(max_running=1, max_waiting=1)
    holder = g.enter()
    lines = [g.enter(batch=True) for _ in range(5)]  # more than max_waiting: all queued
    interactive = g.enter()  # the queue is still open to a client
    with pytest.raises(RateLimitError):
        g.enter()
    holder.release()
    assert started([interactive, *lines]) == [True] + [False] * 5
    interactive.release()
    for line in lines:
        assert line.admitted.done()
        line.release()
    assert (g.running, g.waiting, g.batch_waiting) == (0, 0, 0)


async def test_a_queued_batch_line_that_gives_up_leaves_the_counts_right() -> None:
    g = gate()
    holder = g.enter()
    line = g.enter(batch=True)
    line.release()
    assert (g.waiting, g.batch_waiting) == (0, 0)
    assert line.admitted.cancelled()
    holder.release()
    assert g.running == 0


async def test_unbounded_model_starts_batch_lines_at_once() -> None:
    g = gate(max_running=None)
    t = g.enter(batch=True)
    assert t.admitted.done()
    t.release()


def test_a_keys_file_priority_is_the_keys_default_and_its_owner_is_found_by_digest(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("keys:\n  - {name: bulk, key: sk-bulk-0123456789, priority: 10}\n")
    store = KeyStore.from_settings(("sk-plain-0123456789",), keys_file)
    bulk = store.authenticate(["Bearer sk-bulk-0123456789"])
    plain = store.authenticate(["Bearer sk-plain-0123456789"])
    assert (bulk.priority, plain.priority) == (10, None)
    assert store.by_owner(bulk.digest.hex()) is bulk
    assert store.by_owner("00" * 32) is None
