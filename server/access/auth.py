"""API keys: who may call `/v1/*`, which models each key reaches, and how fast.

Keys come from `--api-key` (all models, no rate limit) and a YAML keys file:

    keys:
      - name: team-a                 # shown in logs and metrics instead of the key
        key: sk-team-a-...
        models: [smollm2]            # model names or aliases; omitted = every model
        requests_per_minute: 60      # omitted = unlimited
        budget: {tokens_per_day: 100000, max_parallel: 4}   # omitted = none

Keys created through `/admin/keys` live in the ledger database instead (only their digests);
the gateway holds the ledger's current list (`set_stored`, refreshed by `server/access/key_sync.py`
within a second of a change), and any key, from the file or the database, turns keys on.

Only SHA-256 digests of the keys are kept, and a presented key is compared against *every* digest
with `hmac.compare_digest` (no early exit), so the time a check takes says nothing about how much
of a key was right. Keys never reach a log line: records name the key, or its digest's prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import Field, ValidationError

from raygate.backends.cluster.stores.ledger_records import StoredKey
from raygate.protocol.base import StrictModel
from raygate.protocol.errors import AuthenticationError, PermissionDeniedError, RateLimitError
from raygate.protocol.ledger import KeyBudget
from raygate.server.settings import ConfigError

MIN_KEY_CHARS = 8


class KeyEntry(StrictModel):
    """One entry of the keys file. Strict, so a misspelt `models` or rate field fails at start instead of
    silently granting more."""

    name: str | None = Field(None, description="Label for logs and metrics (default: digest prefix).")
    key: str = Field(
        min_length=MIN_KEY_CHARS,
        description="The key clients send (`Authorization: Bearer` or `x-api-key`).",
    )
    models: list[str] | None = Field(None, description="Model ids this key may use (default: all).")
    requests_per_minute: float | None = Field(None, gt=0, description="Rate limit (default: none).")
    budget: KeyBudget | None = Field(None, description="Token and parallel-request budget (default: none).")
    priority: int | None = Field(
        None,
        description="Admission priority of the key's requests that set none (vLLM's: lower first; 0).",
    )


class KeysFile(StrictModel):
    """The keys file's top level. `keys` may not be empty: a keys file that names no key is a mistake, not an
    open gateway."""

    keys: list[KeyEntry] = Field(min_length=1)


@dataclass
class TokenBucket:
    """`rate` requests per second on average, bursts up to `capacity`."""

    rate: float
    capacity: float
    tokens: float
    stamp: float = field(default_factory=time.monotonic)

    def take(self) -> float:
        """Take one token; 0.0 if granted, else the seconds until one is available."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass(eq=False)
class ApiKey:
    """A configured key as kept in memory: its SHA-256 digest (never the key), the name logs show, the models
    it may use, and its rate bucket. `id` names it in usage and the audit log: the database's id,
    or the name of a keys-file key."""

    name: str
    digest: bytes
    models: frozenset[str] | None
    bucket: TokenBucket | None
    id: str = ""
    budget: KeyBudget | None = None
    expires_at: float | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        self.id = self.id or self.name

    def allows(self, model_ids: list[str]) -> bool:
        return self.models is None or any(m in self.models for m in model_ids)


def bearer_token(authorization: list[str], what: str = "API key") -> str:
    """The token of exactly one `Authorization: Bearer <token>` header (the scheme in any case, one
    space, no padding), else 401. `/v1` and `/admin` parse it with this one function."""
    if len(authorization) != 1:
        raise AuthenticationError(
            f"You didn't provide an {what}. Send it as `Authorization: Bearer YOUR_KEY`."
            if not authorization
            else "Send exactly one Authorization header."
        )
    scheme, _, token = authorization[0].partition(" ")
    if scheme.lower() != "bearer" or not token or token != token.strip() or " " in token:
        raise AuthenticationError(f"Send the {what} as `Authorization: Bearer YOUR_KEY`.")
    return token


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def _bucket(rpm: float | None) -> TokenBucket | None:
    return None if rpm is None else TokenBucket(rate=rpm / 60, capacity=max(1.0, rpm), tokens=max(1.0, rpm))


def _budget(budget: KeyBudget | None) -> KeyBudget | None:
    return None if budget is None or budget.empty else budget


def _entry_to_key(entry: KeyEntry) -> ApiKey:
    digest = _digest(entry.key)
    return ApiKey(
        name=entry.name or f"key#{digest.hex()[:8]}",
        digest=digest,
        models=None if entry.models is None else frozenset(entry.models),
        bucket=_bucket(entry.requests_per_minute),
        budget=_budget(entry.budget),
        priority=entry.priority,
    )


def _stored_to_key(stored: StoredKey, before: ApiKey | None) -> ApiKey:
    """A database key; one the gateway already held keeps its rate bucket (a refresh of the list
    must not hand out a new burst)."""
    bucket = _bucket(stored.requests_per_minute)
    kept = before.bucket if before is not None else None
    if kept is not None and bucket is not None and kept.rate == bucket.rate:
        bucket = kept
    return ApiKey(
        name=stored.name,
        digest=bytes.fromhex(stored.digest),
        models=None if stored.models is None else frozenset(stored.models),
        bucket=bucket,
        id=stored.id,
        budget=_budget(stored.budget),
        expires_at=stored.expires_at,
    )


def load_keys_file(path: Path) -> list[KeyEntry]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read keys file {path}: {exc}") from exc
    try:
        return KeysFile.model_validate(raw).keys
    except ValidationError as exc:
        # pydantic echoes the input; a key must not end up on a terminal or in a log.
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
        raise ConfigError(f"invalid keys file {path}: check {', '.join(fields)}") from None


class KeyStore:
    """The configured keys. Empty means the gateway is open (no `Authorization` needed)."""

    def __init__(self, entries: list[KeyEntry]) -> None:
        self._keys = [_entry_to_key(e) for e in entries]
        if len({k.digest for k in self._keys}) != len(self._keys):
            raise ConfigError("the same API key is configured twice")
        # The ledger's keys by digest: a dict lookup of a SHA-256 digest tells a timing observer
        # nothing about the secret (finding a preimage is the hard part), unlike a string compare.
        self._stored: dict[bytes, ApiKey] = {}
        self._stored_by_id: dict[str, ApiKey] = {}

    def set_stored(self, keys: list[StoredKey]) -> None:
        """Replace the database keys with the ledger's current list (revoked ones are absent)."""
        fresh = [_stored_to_key(k, self._stored_by_id.get(k.id)) for k in keys]
        self._stored = {k.digest: k for k in fresh}
        self._stored_by_id = {k.id: k for k in fresh}

    @classmethod
    def from_settings(
        cls, keys: tuple[str, ...], keys_file: Path | None, admin_key: str | None = None
    ) -> KeyStore:
        """`admin_key`: with client keys on, the admin key also reaches every model (Xinference's
        client sends one key for managing and calling models). It never turns keys on by itself."""
        entries = []
        for i, k in enumerate(key for key in keys if key):
            try:
                entries.append(
                    KeyEntry(key=k, name=None, models=None, requests_per_minute=None, priority=None)
                )
            except ValidationError:
                # pydantic's message quotes the input: say what is wrong, never the key itself.
                raise ConfigError(
                    f"API key #{i + 1} (--api-key / RAYGATE_API_KEYS) is too short: keys need at "
                    f"least {MIN_KEY_CHARS} characters"
                ) from None
        if keys_file is not None:
            entries += load_keys_file(keys_file)
        if (
            entries
            and admin_key
            and len(admin_key) >= MIN_KEY_CHARS
            and all(e.key != admin_key for e in entries)
        ):
            entries.append(
                KeyEntry(key=admin_key, name="admin", models=None, requests_per_minute=None, priority=None)
            )
        return cls(entries)

    @property
    def enabled(self) -> bool:
        return bool(self._keys) or bool(self._stored)

    def by_owner(self, owner: str) -> ApiKey | None:
        """The key whose digest (hex) owns stored objects (a batch runs with its owner's key)."""
        return next((k for k in self._keys if k.digest.hex() == owner), None)

    def _lookup(self, presented: str) -> ApiKey | None:
        digest = _digest(presented)
        found: ApiKey | None = None
        for key in self._keys:  # no early exit: the scan costs the same for every key
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found or self._stored.get(digest)

    def authenticate(self, authorization: list[str], api_key: list[str] | None = None) -> ApiKey:
        """Check the key a request presents (its `Authorization` and `x-api-key` header values);
        raise 401 or 429."""
        key = self._lookup(presented_key(authorization, api_key or []))
        if key is None:
            raise AuthenticationError("Incorrect API key provided.")
        if key.expires_at is not None and key.expires_at <= time.time():
            raise AuthenticationError(f"The API key `{key.name}` has expired.", code="key_expired")
        if key.bucket is not None:
            wait = key.bucket.take()
            if wait > 0:
                raise RateLimitError(
                    f"Rate limit reached for key `{key.name}`. Please retry after {math.ceil(wait)} s.",
                    retry_after=math.ceil(wait),
                )
        return key


def presented_key(authorization: list[str], api_key: list[str]) -> str:
    """The key from `Authorization: Bearer KEY` (OpenAI's SDK) or `x-api-key: KEY` (Anthropic's);
    both may be sent only if they agree. Anything ambiguous or malformed is a 401. The bearer form
    is parsed by `bearer_token`, as on `/admin`."""
    if not api_key:
        return bearer_token(authorization)
    if len(api_key) != 1 or not _plain(api_key[0]):
        raise AuthenticationError("Send exactly one API key as `x-api-key: YOUR_KEY`.")
    if authorization and not hmac.compare_digest(_digest(bearer_token(authorization)), _digest(api_key[0])):
        raise AuthenticationError("The `Authorization` and `x-api-key` headers carry different keys.")
    return api_key[0]


def _plain(token: str) -> bool:
    return bool(token) and token == token.strip() and " " not in token


def check_model_access(key: ApiKey | None, model_ids: list[str]) -> None:
    if key is not None and not key.allows(model_ids):
        raise PermissionDeniedError(
            f"The API key `{key.name}` may not use the model `{model_ids[0]}`.", param="model"
        )
