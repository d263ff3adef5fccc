"""Usage records and audit entries on their way to the ledger, off the request path.

A request hands its record over when it has ended (`RequestContext.on_close`, after the last byte
was sent): an append to a bounded buffer, nothing awaited. One task writes the buffer to the ledger
actor in batches, every `FLUSH_S` or at once when a budgeted key's request ended (another
gateway's budget check must see it) or an admin action was audited. A batch that could not be
written stays in the buffer for the next round; past `MAX_BUFFERED` records (a ledger down for
long) the oldest are dropped and counted in the log. `close()` writes what is left: a graceful
shutdown loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from raygate.backends.cluster.stores.ledger_records import UsageRecord

log = logging.getLogger(__name__)

FLUSH_S = 1.0
BATCH = 1000
MAX_BUFFERED = 100_000

Send = Callable[[str, list[Any]], Awaitable[None]]


class LedgerWriter:
    """The buffer and its writer task (see the module docstring)."""

    def __init__(self, send: Send, max_buffered: int = MAX_BUFFERED) -> None:
        self._send = send
        self._usage: deque[UsageRecord] = deque()
        self._audit: deque[dict[str, Any]] = deque()
        self._max = max_buffered
        self._dropped = 0
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def pending(self) -> int:
        return len(self._usage) + len(self._audit)

    def usage(self, record: UsageRecord, *, urgent: bool = False) -> None:
        self._append(self._usage, record)
        if urgent:
            self._wake.set()

    def audit(self, entry: dict[str, Any]) -> None:
        self._append(self._audit, entry)
        self._wake.set()

    def _append(self, buffer: deque[Any], item: Any) -> None:
        buffer.append(item)
        if len(buffer) > self._max:
            buffer.popleft()
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                log.error("ledger unreachable: %d usage/audit records dropped so far", self._dropped)

    async def flush(self) -> None:
        """Write everything buffered now, in batches; a failed batch goes back to the front."""
        async with self._lock:
            await self._drain("append_audit", self._audit)
            await self._drain("record", self._usage)

    async def _drain(self, method: str, buffer: deque[Any]) -> None:
        while buffer:
            batch = [buffer.popleft() for _ in range(min(BATCH, len(buffer)))]
            try:
                await self._send(method, batch)
            except BaseException:  # cancelled mid-write too: the batch is not lost
                buffer.extendleft(reversed(batch))
                raise

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_S)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # the ledger restarting: the records wait for the next round
                log.warning("could not write usage to the ledger (%d waiting): %s", self.pending, exc)

    async def close(self) -> None:
        await self.flush()
