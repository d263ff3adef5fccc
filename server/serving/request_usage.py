"""`record_usage`: a request's token usage handed to the ledger and the per-key metrics when it ends.

Its own room because it runs once per request, on the request context's close (off the request's
latency), after every engine call of the request's `ModelHandle` has counted its part; the counts
themselves are the handle's (server/serving/call_recorder.py).
"""

from __future__ import annotations

import time

from fastapi import Request

from raygate.backends.cluster.stores.ledger_records import UsageRecord
from raygate.server.context import request_context
from raygate.server.observability.ledger_writer import LedgerWriter
from raygate.server.observability.usage_metrics import KeyLabels, count_usage
from raygate.server.serving.handle import ModelHandle

# The key id of requests to a gateway without keys.
ANONYMOUS = "anonymous"


def record_usage(request: Request, handle: ModelHandle, endpoint: str) -> None:
    """Hand the request's usage to the ledger writer and the per-key metrics (a request that
    reached no engine has none)."""
    usage = handle.usage
    state = request.app.state
    ctx = request_context(request)
    if not usage.calls:
        if handle.reserved and ctx.key is not None:
            state.budgets.unreserve(ctx.key.id, handle.reserved)
        return
    record = UsageRecord(
        at=time.time(),
        key_id=ctx.key.id if ctx.key is not None else ANONYMOUS,
        model=handle.config.name,
        endpoint=endpoint,
        request_id=ctx.request_id,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        reserved=handle.reserved,
    )
    labels: KeyLabels = state.key_labels
    count_usage(state.metrics, labels, record)
    writer: LedgerWriter | None = getattr(state, "ledger_writer", None)
    if writer is not None:
        writer.usage(record, urgent=ctx.key is not None and ctx.key.budget is not None)
