"""Per-key token counters in `/metrics`, with a bounded number of label values.

A gateway with thousands of keys must not grow thousands of Prometheus series per counter: the
first `limit` key ids seen get their own `key_id` label, every later one counts as `other` (the
ledger, `GET /admin/usage`, has the exact figures per key). Keys seen first are the ones in use
since the gateway started, which on a busy gateway are its heaviest users too.
"""

from __future__ import annotations

from raygate.backends.cluster.stores.ledger_records import UsageRecord
from raygate.server.observability.metrics import GatewayMetrics

OTHER = "other"


class KeyLabels:
    """Which key ids get a label of their own."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._named: set[str] = set()

    def label(self, key_id: str) -> str:
        if key_id in self._named:
            return key_id
        if len(self._named) < self._limit and key_id != OTHER:
            self._named.add(key_id)
            return key_id
        return OTHER


def count_usage(metrics: GatewayMetrics, labels: KeyLabels, record: UsageRecord) -> None:
    key = {"key_id": labels.label(record.key_id), "model_name": record.model}
    metrics.key_requests.inc(key)
    metrics.key_prompt_tokens.add(key, record.prompt_tokens)
    metrics.key_generation_tokens.add(key, record.completion_tokens)
