"""What gateways and the ledger pass each other: a request's usage, a key as gateways check it,
and the UTC windows budgets count in. Apart from `ledger_db.py` so that a gateway, which only
sends and receives these, never loads SQLAlchemy and alembic (~20 MB of its RSS); the database
is the stores actor's alone."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from raygate.protocol.ledger import KeyBudget

KEY_PREFIX = "sk-rg-"
GROUPS = ("key", "model", "day", "endpoint")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One request's tokens, as the gateway's serving layer counted them (the response's `usage`)."""

    at: float
    key_id: str
    model: str
    endpoint: str
    request_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    # Budget tokens the request held while it ran (ledger.py's `reserve`), given back when this
    # record is written: its real tokens take their place in the same actor call. Not stored.
    reserved: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A database key as the gateways authenticate it: the digest, never the secret."""

    id: str
    name: str
    digest: str
    models: tuple[str, ...] | None
    requests_per_minute: float | None
    budget: KeyBudget
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class Spent:
    """A key's tokens in the current UTC day and month, and when each window starts again."""

    day: int
    month: int
    day_resets_at: float
    month_resets_at: float


class UnknownKeyError(LookupError):
    """No key has this id (or it is revoked, for rotate)."""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def utc_day(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d")


def windows(now: float) -> tuple[float, float, float, float]:
    """The starts of the current UTC day and month, and of the next ones."""
    today = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    month = today.replace(day=1)
    next_month = (month + dt.timedelta(days=32)).replace(day=1)
    return (
        today.timestamp(),
        month.timestamp(),
        (today + dt.timedelta(days=1)).timestamp(),
        next_month.timestamp(),
    )
