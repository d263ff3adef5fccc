"""The ledger: the part of the stores actor (`host.py`) that owns the usage / keys / audit database.

Why an actor, as for the response store (`responses.py`): every gateway of a Ray namespace finds
it by name, so usage from all of them lands in one place, a key created or revoked through one
gateway reaches the others (they poll `keys`, cheap: a version string unless something changed),
and budgets are checked against one sum. It runs where the controller runs
(`placement.state_actor_options`), so its default SQLite file sits in that node's `--state-dir`;
with `--database-url` it is a PostgreSQL client instead, and the actor is just the one writer.

Budgets: `admit` compares a key's tokens this UTC day / month (what the gateways have flushed,
plus what running requests hold) with its budget, and counts its running requests against
`max_parallel` (`release` when they end). A request about to reach a model `reserve`s the most
tokens it can use (its model's context per sequence); its usage record gives the reservation back
in the same call that counts its real tokens (`record`). A request is let in only while the spent
and reserved tokens are below the budget, so the running requests can never use more than they
hold and the budget is overshot by at most the one request that took its last tokens: whatever
the number of gateways.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raygate.backends.cluster.runtime.errors import LEDGER_ERRORS
from raygate.backends.cluster.stores.actor_client import StoreActorClient
from raygate.backends.cluster.stores.ledger_records import StoredKey, UnknownKeyError, UsageRecord
from raygate.protocol.ledger import AuditEntry, KeyBudget, KeyCreate, KeyCreated, KeyInfo, UsageRow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why `admit` said no: `quota` (a token budget is spent until `resets_at`) or `parallel`."""

    reason: str
    message: str
    resets_at: float


class Ledger:
    """The actor: `LedgerDB` behind Ray calls (one at a time), plus the running-request counts."""

    def __init__(self, database_url: str | None, state_dir: str | None) -> None:
        # Here, not at the top: gateways import this module for its client and never load
        # SQLAlchemy and alembic (ledger_records.py).
        from raygate.backends.cluster.stores.ledger_db import LedgerDB

        self._db = LedgerDB(database_url, Path(state_dir) if state_dir else None)
        # Bumped on every key change; a new actor starts a new epoch, so no gateway keeps a stale list.
        self._epoch, self._changes = uuid.uuid4().hex[:8], 0
        # Wakes the gateways' `wait_keys` calls (their own threads: host.py) when the keys change.
        self._keys_changed = threading.Condition()
        self._running: dict[str, int] = {}
        self._reserved: dict[str, int] = {}
        log.info("ledger at %s", self._db.where)

    def info(self) -> dict[str, Any]:
        return {"where": self._db.where, "keys_version": self._version()}

    def _version(self) -> str:
        return f"{self._epoch}-{self._changes}"

    # --- usage ---------------------------------------------------------------------------------

    def record(self, records: list[UsageRecord]) -> None:
        self._db.record(records)
        for r in records:
            if r.reserved:
                self.unreserve(r.key_id, r.reserved)

    def report(self, group_by: list[str], filters: dict[str, Any]) -> list[UsageRow]:
        return self._db.report(group_by, **filters)

    def admit(self, key_id: str, budget: KeyBudget, now: float | None = None) -> Refusal | None:
        now = time.time() if now is None else now
        if budget.limits_tokens and (refusal := self._quota(key_id, budget, now)) is not None:
            return refusal
        if budget.max_parallel is not None:
            running = self._running.get(key_id, 0)
            if running >= budget.max_parallel:
                message = f"has {running} requests running (at most {budget.max_parallel})"
                return Refusal("parallel", message, now + 1)
            self._running[key_id] = running + 1
        return None

    def _quota(self, key_id: str, budget: KeyBudget, now: float) -> Refusal | None:
        """Whether the key's spent and reserved tokens leave nothing of a token budget."""
        spent = self._db.spent(key_id, now)
        reserved = self._reserved.get(key_id, 0)
        windows = (
            ("day", spent.day, budget.tokens_per_day, spent.day_resets_at),
            ("month", spent.month, budget.tokens_per_month, spent.month_resets_at),
        )
        for window, used, limit, resets_at in windows:
            if limit is None or used + reserved < limit:
                continue
            if used >= limit:
                return Refusal("quota", f"used {used} of its {limit} tokens per {window}", resets_at)
            # Not spent yet, but held by running requests: worth a retry when they end.
            message = (
                f"used {used} of its {limit} tokens per {window}, and its running requests hold the rest"
            )
            return Refusal("quota", message, now + 1)
        return None

    def reserve(
        self, key_id: str, budget: KeyBudget, tokens: int, now: float | None = None
    ) -> Refusal | None:
        """Hold `tokens` of the key's token budget for a request about to reach a model, unless
        the budget has nothing left that is neither spent nor held."""
        if not budget.limits_tokens or tokens <= 0:
            return None
        refusal = self._quota(key_id, budget, time.time() if now is None else now)
        if refusal is None:
            self._reserved[key_id] = self._reserved.get(key_id, 0) + tokens
        return refusal

    def unreserve(self, key_id: str, tokens: int) -> None:
        """Give back what a request held (its record does, or the gateway when it used nothing)."""
        left = self._reserved.get(key_id, 0) - tokens
        if left > 0:
            self._reserved[key_id] = left
        else:
            self._reserved.pop(key_id, None)

    def release(self, key_id: str) -> None:
        left = self._running.get(key_id, 0) - 1
        if left > 0:
            self._running[key_id] = left
        else:
            self._running.pop(key_id, None)

    # --- keys ----------------------------------------------------------------------------------

    def _bump(self) -> None:
        with self._keys_changed:
            self._changes += 1
            self._keys_changed.notify_all()

    def wait_keys(self, version: str | None, timeout: float) -> str:
        """The keys' version once it differs from `version`, or after `timeout` seconds: a
        gateway's long poll (server/access/key_sync.py). Touches no database, so it may run on
        another thread than the ledger's other calls."""
        with self._keys_changed:
            self._keys_changed.wait_for(lambda: self._version() != version, timeout)
            return self._version()

    def keys(self, version: str | None) -> tuple[str, list[StoredKey] | None]:
        """The current version, and the active keys unless the caller already has that version."""
        current = self._version()
        return current, None if version == current else self._db.active_keys()

    def create_key(self, body: KeyCreate) -> KeyCreated:
        created = self._db.create_key(body)
        self._bump()
        return created

    def list_keys(self) -> list[KeyInfo]:
        return self._db.list_keys()

    def get_key(self, key_id: str) -> KeyInfo | None:
        try:
            return self._db.get_key(key_id)
        except UnknownKeyError:
            return None

    def rotate_key(self, key_id: str) -> KeyCreated | None:
        try:
            rotated = self._db.rotate_key(key_id)
        except UnknownKeyError:
            return None
        self._bump()
        return rotated

    def revoke_key(self, key_id: str) -> KeyInfo | None:
        try:
            revoked = self._db.revoke_key(key_id)
        except UnknownKeyError:
            return None
        self._bump()
        return revoked

    # --- audit ---------------------------------------------------------------------------------

    def append_audit(self, entries: list[dict[str, Any]]) -> None:
        self._db.append_audit(entries)

    def audit_log(self, filters: dict[str, Any]) -> list[AuditEntry]:
        return self._db.audit_log(**filters)


class LedgerClient(StoreActorClient):
    """The gateway's handle on the ledger (`StoreActorClient`'s retries); what the ledger itself
    refuses is mapped through LEDGER_ERRORS."""

    what = "ledger"
    part = "ledger"
    errors = LEDGER_ERRORS
    map_task_errors = True

    async def call(self, method: str, *args: Any) -> Any:
        return await self._call(method, *args)

    async def wait_keys(self, version: str | None, timeout: float) -> str:
        """`Ledger.wait_keys`, on the stores actor's watch threads (host.py)."""
        current: str = await self._call("wait_keys", version, timeout, part="ledger_watch")
        return current
