"""Per-model admission: a bound on requests running at the replicas and waiting in the gateway.

The decision is synchronous and happens while the route resolves the model, before any byte of
the response and before anything reaches an engine: past `max_running + max_waiting` the request
is refused with 429 and a `Retry-After` estimated from recent request durations. Admitted requests
that find every running slot taken wait in FIFO order; the wait itself happens on the first call to
the engine, under the request's time-to-first-token deadline.

Counts are per model and per *request* (n samples or several prompts count once), and they are
what the `num_requests_running` / `num_requests_waiting` gauges show.

Priority classes: waiting tickets start in the order of (class, `priority`, arrival). A request's
`priority` is vLLM's (lower is handled first, default 0; the API key's default when the body has
none). Batch lines (`server/serving/batch_runner.py`) form a class below every interactive
request: they start only while no interactive request waits for the model, whatever their
`priority`; they are never refused with 429 (the runner bounds how many it starts) and never
count towards `max_waiting`, so a batch cannot fill the queue interactive requests need.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from raygate.protocol.config import ModelLimits
from raygate.protocol.errors import RateLimitError

# Weight of the newest duration in the running average behind `Retry-After`.
_EWMA_ALPHA = 0.2
_MAX_RETRY_AFTER = 60


@dataclass(eq=False)
class Ticket:
    """One admitted request's claim on its model's gate: it waits for a running slot, and `release()` (safe to
    call twice) frees the slot or the queue place."""

    gate: ModelGate
    admitted: asyncio.Future[None]
    created: float
    priority: int = 0
    batch: bool = False
    order: int = 0  # arrival, the tie-break between equal priorities
    released: bool = False
    started: float = 0.0  # loop time when it got a running slot

    async def wait(self) -> float:
        """Wait for a running slot; returns the seconds spent queued.

        The future is shielded: a caller that times out must not cancel it, since the gate decides
        from the future's state whether the ticket holds a running slot.
        """
        if not self.admitted.done():
            await asyncio.shield(self.admitted)
        return self.started - self.created

    def rank(self) -> tuple[bool, int, int]:
        """The queue's order: interactive before batch, then `priority`, then arrival."""
        return (self.batch, self.priority, self.order)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate._release(self)


@dataclass(eq=False)
class ModelGate:
    """One model's admission state: running and waiting counts, the FIFO of waiting tickets, and the running
    average of durations behind `Retry-After`."""

    name: str
    limits: ModelLimits
    on_change: Callable[[ModelGate], None] = lambda gate: None
    running: int = 0
    waiting: int = 0
    batch_waiting: int = 0  # of `waiting`: batch lines
    avg_seconds: float = 1.0
    _queue: list[Ticket] = field(default_factory=list)  # sorted by `Ticket.rank`
    _arrivals: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def interactive_waiting(self) -> int:
        return self.waiting - self.batch_waiting

    def enter(self, priority: int = 0, batch: bool = False) -> Ticket:
        """Admit or refuse (429) now; an admitted ticket may still have to wait for a slot."""
        loop = asyncio.get_running_loop()
        ticket = Ticket(
            self,
            loop.create_future(),
            created=loop.time(),
            priority=priority,
            batch=batch,
            order=next(self._arrivals),
        )
        if self._may_start(ticket):
            self._start(ticket)
        elif batch or self.limits.max_waiting is None or self.interactive_waiting < self.limits.max_waiting:
            self.waiting += 1
            self.batch_waiting += batch
            bisect.insort(self._queue, ticket, key=Ticket.rank)
        else:
            raise RateLimitError(
                f"Model `{self.name}` is at capacity ({self.running} running, {self.waiting} waiting). "
                "Please retry later.",
                code="queue_full",
                retry_after=self.retry_after(),
            )
        self.on_change(self)
        return ticket

    def retry_after(self) -> int:
        slots = self.limits.max_running or 1
        estimate = self.avg_seconds * (self.waiting + 1) / slots
        return max(1, min(_MAX_RETRY_AFTER, math.ceil(estimate)))

    def _may_start(self, ticket: Ticket) -> bool:
        """A free running slot, and for a batch line no interactive request waiting."""
        max_running = self.limits.max_running
        if max_running is not None and self.running >= max_running:
            return False
        return not ticket.batch or self.interactive_waiting == 0

    def _start(self, ticket: Ticket) -> None:
        self.running += 1
        ticket.started = asyncio.get_running_loop().time()
        ticket.admitted.set_result(None)

    def _release(self, ticket: Ticket) -> None:
        if ticket.admitted.done():
            self.running -= 1
            elapsed = asyncio.get_running_loop().time() - ticket.started
            self.avg_seconds += _EWMA_ALPHA * (elapsed - self.avg_seconds)
        else:  # still queued: the client gave up, or the request failed before its turn
            self.waiting -= 1
            self.batch_waiting -= ticket.batch
            self._queue.remove(ticket)
            ticket.admitted.cancel()
        while self._queue and self._may_start(self._queue[0]):
            head = self._queue.pop(0)
            self.waiting -= 1
            self.batch_waiting -= head.batch
            self._start(head)
        self.on_change(self)


@dataclass
class Admission:
    """One gate per model, created on first use (models may be added while the gateway runs)."""

    on_change: Callable[[ModelGate], None] = lambda gate: None
    gates: dict[str, ModelGate] = field(default_factory=dict)

    def waiting(self, name: str) -> int:
        """Requests queued for `name`'s running slots (0 for a model not seen yet)."""
        gate = self.gates.get(name)
        return gate.waiting if gate is not None else 0

    def gate(self, name: str, limits: ModelLimits) -> ModelGate:
        gate = self.gates.get(name)
        if gate is None:
            gate = self.gates[name] = ModelGate(name, limits, self.on_change)
        gate.limits = limits
        return gate
