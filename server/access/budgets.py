"""Budgets: a key's tokens per UTC day and month, and its requests running at once.

Checked before a request reaches a model, against the ledger (one actor call, only for keys that
have a budget), so every gateway of a namespace enforces the same sums. The sums count finished
requests, and a budgeted key's usage is written as soon as its request ends
(`server/observability/ledger_writer.py`): a gateway can overshoot a token budget only by the
requests it had already admitted when the budget ran out. A key over budget gets OpenAI's 429
`insufficient_quota`, saying when its day or month starts again (also as `Retry-After`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time

from raygate.backends.cluster.stores.ledger import LedgerClient, Refusal
from raygate.protocol.errors import QuotaExceededError, RateLimitError
from raygate.server.access.auth import ApiKey
from raygate.server.context import RequestContext


def refusal_error(key: ApiKey, refusal: Refusal, now: float) -> RateLimitError:
    wait = max(1, math.ceil(refusal.resets_at - now))
    if refusal.reason == "quota":
        resets = dt.datetime.fromtimestamp(refusal.resets_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return QuotaExceededError(
            f"You exceeded your current quota: the API key `{key.name}` {refusal.message}. "
            f"It resets at {resets}.",
            retry_after=wait,
        )
    return RateLimitError(
        f"Too many parallel requests: the API key `{key.name}` {refusal.message}.",
        code="parallel_requests_exceeded",
        retry_after=wait,
    )


class Budgets:
    """Admission by budget; a slot taken for `max_parallel` is given back when the request ends."""

    def __init__(self, ledger: LedgerClient) -> None:
        self._ledger = ledger
        self._releases: set[asyncio.Task[None]] = set()

    async def admit(self, ctx: RequestContext) -> None:
        key = ctx.key
        if key is None or key.budget is None:
            return
        refusal: Refusal | None = await self._ledger.call("admit", key.id, key.budget)
        if refusal is not None:
            raise refusal_error(key, refusal, time.time())
        if key.budget.max_parallel is not None:
            ctx.on_close(lambda: self._release(key.id))

    def _release(self, key_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._ledger.call("release", key_id))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def close(self) -> None:
        """Wait for the releases still on their way (a graceful shutdown)."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)
