"""Budgets: a key's tokens per UTC day and month, and its requests running at once.

Checked before a request reaches a model, against the ledger (one actor call, only for keys that
have a budget), so every gateway of a namespace enforces the same sums. The sums count finished
requests and what running ones hold: just before its first engine call a request reserves the
most it can use (`reserve`: the model's context per sequence, server/serving/handle.py), and its
usage record, written as soon as it ends (`server/observability/ledger_writer.py`), trades the
reservation for its real tokens. A budget is therefore overshot by at most the one request that
took its last tokens (backends/cluster/stores/ledger.py). A key over budget gets OpenAI's 429
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

    async def reserve(self, ctx: RequestContext, tokens: int) -> int:
        """Hold `tokens` of the key's token budget (429 when nothing is left); returns what was
        held (0: the key has no token budget)."""
        key = ctx.key
        if key is None or key.budget is None or not key.budget.limits_tokens or tokens <= 0:
            return 0
        refusal: Refusal | None = await self._ledger.call("reserve", key.id, key.budget, tokens)
        if refusal is not None:
            raise refusal_error(key, refusal, time.time())
        return tokens

    def unreserve(self, key_id: str, tokens: int) -> None:
        """Give back a reservation whose request recorded no usage (it reached no engine)."""
        self._background("unreserve", key_id, tokens)

    def _release(self, key_id: str) -> None:
        self._background("release", key_id)

    def _background(self, method: str, *args: object) -> None:
        task = asyncio.get_running_loop().create_task(self._ledger.call(method, *args))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def close(self) -> None:
        """Wait for the releases still on their way (a graceful shutdown)."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)
