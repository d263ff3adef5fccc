"""The wire format of `/admin/usage`, `/admin/keys` and `/admin/audit`: token usage per key,
model and day, API keys kept in the database (the secret appears once, in `KeyCreated`), their
budgets, and the append-only log of admin actions."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from raygate.protocol.base import ResponseModel, StrictModel
from raygate.protocol.errors import OpenAIError

MIN_NAME_CHARS = 1
# Counts a database integer holds (PostgreSQL's BIGINT), with room to add a day's usage.
MAX_TOKENS = 1 << 62
# PostgreSQL's text refuses NUL: a name with one is a 400 here, not a database error.
Text = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00]*$")]


class KeyNotFoundError(OpenAIError):
    """404 for a key id the ledger does not hold (or, for rotate, one already revoked)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "key_not_found"

    @classmethod
    def for_id(cls, key_id: str) -> KeyNotFoundError:
        return cls(f"No API key with id '{key_id}'.", param="key_id")


class KeyBudget(StrictModel):
    """What one key may spend. Days and months are UTC calendar days and months; a request that
    finds the key over a token budget gets 429 `insufficient_quota` with the time it resets."""

    tokens_per_day: int | None = Field(
        None, gt=0, le=MAX_TOKENS, description="Prompt + completion tokens per UTC day."
    )
    tokens_per_month: int | None = Field(
        None, gt=0, le=MAX_TOKENS, description="Prompt + completion tokens per UTC month."
    )
    max_parallel: int | None = Field(
        None, gt=0, le=1 << 31, description="Requests running at once, across gateways."
    )

    @property
    def limits_tokens(self) -> bool:
        return self.tokens_per_day is not None or self.tokens_per_month is not None

    @property
    def empty(self) -> bool:
        return not self.limits_tokens and self.max_parallel is None


class KeyCreate(StrictModel):
    """`POST /admin/keys`. Strict: a misspelt `budget` or `models` fails instead of granting more."""

    name: Text
    models: list[Text] | None = Field(
        None, max_length=1024, description="Model names or aliases; omitted = every model."
    )
    requests_per_minute: float | None = Field(None, gt=0, allow_inf_nan=False)
    budget: KeyBudget = Field(default_factory=KeyBudget)
    expires_at: float | None = Field(
        None, allow_inf_nan=False, description="Unix time after which the key is refused."
    )
    expires_in_s: float | None = Field(
        None, gt=0, le=1e11, allow_inf_nan=False, description="Or: seconds from now."
    )


class KeyInfo(ResponseModel):
    """A key as listed: never its secret (only a digest is stored)."""

    id: str
    name: str
    models: list[str] | None = None
    requests_per_minute: float | None = None
    budget: KeyBudget
    created_at: float
    expires_at: float | None = None
    rotated_at: float | None = None
    revoked_at: float | None = None
    state: Literal["active", "expired", "revoked"]


class KeyCreated(KeyInfo):
    """`POST /admin/keys` and `POST /admin/keys/{id}/rotate`: the key with its secret, shown once."""

    key: str = Field(description="The secret clients send; it cannot be read again.")


class KeyList(ResponseModel):
    """`GET /admin/keys`: every key the ledger holds, revoked and expired ones too."""

    object: Literal["list"] = "list"
    data: list[KeyInfo]


class UsageRow(ResponseModel):
    """Tokens summed over one group (`group_by`); a field not grouped by is null."""

    key_id: str | None = None
    model: str | None = None
    day: str | None = Field(None, description="UTC day, YYYY-MM-DD.")
    endpoint: str | None = None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    total_tokens: int


class UsageReport(ResponseModel):
    """`GET /admin/usage`: one row per group, ordered by the groups."""

    object: Literal["list"] = "list"
    group_by: list[str]
    data: list[UsageRow]


class AuditEntry(ResponseModel):
    """One admin action: who (the key's id, `admin` for the admin key, `anonymous` on an open
    /admin), what, on what, when, and how it ended."""

    id: int
    at: float
    actor: str
    action: str
    target: str
    status: int
    outcome: Literal["ok", "refused", "failed"]
    request_id: str


class AuditLog(ResponseModel):
    """`GET /admin/audit`: the newest entries first."""

    object: Literal["list"] = "list"
    data: list[AuditEntry]
