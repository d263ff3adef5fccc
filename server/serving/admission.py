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

Batch lines also take only the engine slots interactive traffic leaves free, on every model, with
or without `max_running`: the model's slots (`slots`: its ready replicas times the sequences each
decodes at once, `engine_slots`) minus the most interactive engine calls under way at once over
the last `PEAK_WINDOW_S` seconds. A closed loop of 4 clients on 8 slots leaves the batch 4, which
it keeps while the loop's requests come and go (no line starts in the instant between one
interactive request and the next, only to be preempted); a burst past the peak finds every slot
taken and preempts a batch line in the engine (`backends/engines/llama_cpp/batched.py`). Engine
calls, not requests: a request holds its engine slot from its call's start to its last token
(`Ticket.call_started` / `call_ended`), but its running slot here until its response has been
sent whole, and a closed loop's client sends its next request as soon as it has read the last
token. Counted by requests, the loop of 4 ran 5 at once every few seconds, and the batch kept to
3 of its 4 slots (measured: a quarter of the spare capacity left unused).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import RateLimitError
from raygate.protocol.model_limits import ModelLimits

# Weight of the newest duration in the running average behind `Retry-After`.
_EWMA_ALPHA = 0.2
_MAX_RETRY_AFTER = 60
# How long the most interactive requests seen running at once holds back batch lines' room.
PEAK_WINDOW_S = 5.0


def engine_slots(config: ModelConfig) -> int | None:
    """Sequences one replica decodes at once: llama.cpp's `n_seq_max` (1 without it), vLLM's
    `max_num_seqs` when set; None where there is no such bound (vLLM's default, synthetic)."""
    if config.backend == "llama_cpp":
        return int(config.engine.get("n_seq_max", 1))
    if config.backend == "vllm" and "max_num_seqs" in config.engine:
        return int(config.engine["max_num_seqs"])
    return None


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
    calls: int = 0  # its interactive engine calls under way (`call_started`)

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

    def call_started(self) -> None:
        """One of its engine calls began (a sequence holds an engine slot until its last token):
        an interactive one counts towards the slots batch lines must leave free."""
        if self.batch or self.released:
            return
        self.calls += 1
        self.gate.interactive_calls += 1
        self.gate.interactive_peak(asyncio.get_running_loop().time())

    def call_ended(self) -> None:
        """The engine call's last token (or its failure) is in: its engine slot is free."""
        if self.calls > 0 and not self.released:
            self.calls -= 1
            self.gate.interactive_calls -= 1
            self.gate._start_waiting()  # a lapsed peak lets a line start; else it sets the timer
            self.gate.on_change(self.gate)

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
    batch_running: int = 0  # of `running`: batch lines
    # The model's engine slots over its ready replicas (`engine_slots`), None: unbounded.
    slots: int | None = None
    interactive_calls: int = 0  # interactive engine calls under way (`Ticket.call_started`)
    peak: int = 0  # the most of them at once lately (`interactive_peak`)
    peak_at: float = 0.0
    _timer: asyncio.TimerHandle | None = None
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

    def interactive_peak(self, now: float) -> int:
        """The most interactive engine calls under way at once within the last `PEAK_WINDOW_S`
        seconds (a high-water mark that falls to the current count once that long has passed)."""
        current = self.interactive_calls
        if current >= self.peak or now - self.peak_at >= PEAK_WINDOW_S:
            self.peak, self.peak_at = current, now
        return self.peak

    def batch_room(self, now: float) -> int:
        """Batch lines that may start now on slots interactive traffic leaves free (module docstring)."""
        if self.slots is None:
            return 1
        return self.slots - self.interactive_peak(now) - self.batch_running

    def _may_start(self, ticket: Ticket) -> bool:
        """A free running slot; for a batch line also no interactive request waiting and an engine
        slot interactive traffic leaves free."""
        max_running = self.limits.max_running
        if max_running is not None and self.running >= max_running:
            return False
        if not ticket.batch:
            return True
        if self.interactive_waiting:
            return False
        now = asyncio.get_running_loop().time()
        if self.batch_room(now) > 0:
            return True
        if self.peak > self.interactive_calls:
            self._recheck_at(self.peak_at + PEAK_WINDOW_S)  # the peak lapses: look again then
        return False

    def _recheck_at(self, when: float) -> None:
        if self._timer is None or self._timer.when() > when:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(when, self._recheck)

    def _recheck(self) -> None:
        self._timer = None
        self._start_waiting()
        self.on_change(self)

    def _start(self, ticket: Ticket) -> None:
        self.running += 1
        self.batch_running += ticket.batch
        loop = asyncio.get_running_loop()
        ticket.started = loop.time()
        ticket.admitted.set_result(None)

    def _release(self, ticket: Ticket) -> None:
        self.interactive_calls -= ticket.calls  # none, unless a call's end was never reported
        ticket.calls = 0
        if ticket.admitted.done():
            self.running -= 1
            self.batch_running -= ticket.batch
            elapsed = asyncio.get_running_loop().time() - ticket.started
            self.avg_seconds += _EWMA_ALPHA * (elapsed - self.avg_seconds)
        else:  # still queued: the client gave up, or the request failed before its turn
            self.waiting -= 1
            self.batch_waiting -= ticket.batch
            self._queue.remove(ticket)
            ticket.admitted.cancel()
        self._start_waiting()
        self.on_change(self)

    def _start_waiting(self) -> None:
        while self._queue and self._may_start(self._queue[0]):
            head = self._queue.pop(0)
            self.waiting -= 1
            self.batch_waiting -= head.batch
            self._start(head)


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
