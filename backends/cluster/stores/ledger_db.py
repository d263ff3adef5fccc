"""The ledger database: token usage per request, API keys (digests only) and the audit log.

SQLAlchemy Core over SQLite (a file under `--state-dir`, or memory without one) or PostgreSQL
(`--database-url`); alembic migrates the schema to head when the database opens
(`ledger_migrations/`). Only the ledger actor (`ledger.py`) opens it, so there is one writer per
Ray namespace and counters such as `keys_version` can live in its memory.

Tokens of a budget are prompt + completion tokens (OpenAI's `total_tokens`), summed over the
current UTC day or month.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.pool import StaticPool

from raygate.backends.cluster.stores.ledger_records import (
    GROUPS,
    KEY_PREFIX,
    Spent,
    StoredKey,
    UnknownKeyError,
    UsageRecord,
    digest,
    utc_day,
    windows,
)
from raygate.protocol.ledger import (
    AuditEntry,
    KeyBudget,
    KeyCreate,
    KeyCreated,
    KeyInfo,
    UsageRow,
)

DB_FILE = "ledger.sqlite3"
MIGRATIONS = Path(__file__).resolve().parent / "ledger_migrations"
_GROUP_COLUMNS = {"key": "key_id", "model": "model", "day": "day", "endpoint": "endpoint"}
MAX_AUDIT_ROWS = 1000

metadata = sa.MetaData()
usage = sa.Table(
    "usage",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("day", sa.String(10), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_tokens", sa.BigInteger, nullable=False),
    sa.Column("reasoning_tokens", sa.BigInteger, nullable=False),
)
api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("digest", sa.String(64), nullable=False, unique=True),
    sa.Column("models", sa.Text, nullable=True),
    sa.Column("requests_per_minute", sa.Float, nullable=True),
    sa.Column("tokens_per_day", sa.BigInteger, nullable=True),
    sa.Column("tokens_per_month", sa.BigInteger, nullable=True),
    sa.Column("max_parallel", sa.Integer, nullable=True),
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("rotated_at", sa.Float, nullable=True),
    sa.Column("revoked_at", sa.Float, nullable=True),
)
audit = sa.Table(
    "audit",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("actor", sa.String(256), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("target", sa.String(512), nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False),
)


def engine_for(url: str | None, state_dir: Path | None) -> sa.Engine:
    """`url` if given (a bare `postgresql://` gets psycopg 3), else SQLite under `state_dir`, else
    SQLite in memory (one connection kept, so the data lasts as long as the actor)."""
    if url:
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        connect_args = {"connect_timeout": 10} if url.startswith("postgresql+psycopg") else {}
        return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    if state_dir is None:
        return sa.create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    state_dir.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(f"sqlite:///{state_dir / DB_FILE}", connect_args={"check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _pragmas(connection: Any, _: Any) -> None:
        # WAL: a write does not rewrite the file; NORMAL: durable across a process crash.
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def database_problem(url: str) -> str | None:
    """Why the database at `url` cannot be used (it cannot be parsed, its driver is missing, or
    it does not answer within seconds), or None. Asked before Ray starts, so a typo in
    `--database-url` stops `raygate serve` with its reason instead of a ledger actor that Ray
    restarts forever."""
    try:
        engine = engine_for(url, None)
    except (sa.exc.ArgumentError, ImportError) as exc:
        return f"cannot use --database-url: {exc}"
    try:
        with engine.connect():
            pass
    except sa.exc.SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc
        return f"cannot connect to {engine.url.render_as_string(hide_password=True)}: {cause}"
    finally:
        engine.dispose()
    return None


def migrate(engine: sa.Engine) -> None:
    """Bring the schema to alembic's head (a new database gets every revision)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def _key_state(row: Any, now: float) -> str:
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= now:
        return "expired"
    return "active"


def _budget(row: Any) -> KeyBudget:
    return KeyBudget(
        tokens_per_day=row.tokens_per_day,
        tokens_per_month=row.tokens_per_month,
        max_parallel=row.max_parallel,
    )


def _models(row: Any) -> list[str] | None:
    return None if row.models is None else list(json.loads(row.models))


class LedgerDB:
    """Usage, keys and audit entries in one database (see the module docstring)."""

    def __init__(self, url: str | None, state_dir: Path | None) -> None:
        self.engine = engine_for(url, state_dir)
        migrate(self.engine)

    @property
    def where(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    # --- usage ---------------------------------------------------------------------------------

    def record(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        rows = [
            {
                "at": r.at,
                "day": utc_day(r.at),
                "key_id": r.key_id,
                "model": r.model,
                "endpoint": r.endpoint,
                "request_id": r.request_id[:128],
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "cached_tokens": r.cached_tokens,
                "reasoning_tokens": r.reasoning_tokens,
            }
            for r in records
        ]
        with self.engine.begin() as db:
            db.execute(usage.insert(), rows)

    def report(
        self,
        group_by: Iterable[str] = ("key", "model", "day"),
        *,
        key_id: str | None = None,
        model: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[UsageRow]:
        """Token sums per group, filtered by key, model and time (`since` inclusive, `until`
        exclusive), ordered by the groups."""
        groups = [g for g in GROUPS if g in set(group_by)]
        columns = [usage.c[_GROUP_COLUMNS[g]] for g in groups]
        query = sa.select(
            *columns,
            sa.func.count().label("requests"),
            sa.func.sum(usage.c.prompt_tokens).label("prompt_tokens"),
            sa.func.sum(usage.c.completion_tokens).label("completion_tokens"),
            sa.func.sum(usage.c.cached_tokens).label("cached_tokens"),
            sa.func.sum(usage.c.reasoning_tokens).label("reasoning_tokens"),
        )
        if key_id is not None:
            query = query.where(usage.c.key_id == key_id)
        if model is not None:
            query = query.where(usage.c.model == model)
        if since is not None:
            query = query.where(usage.c.at >= since)
        if until is not None:
            query = query.where(usage.c.at < until)
        if columns:
            query = query.group_by(*columns).order_by(*columns)
        with self.engine.connect() as db:
            rows = db.execute(query).all()
        out = []
        for row in rows:
            if not row.requests:
                continue  # no group: an aggregate over nothing is one row of NULLs
            prompt, completion = int(row.prompt_tokens), int(row.completion_tokens)
            out.append(
                UsageRow(
                    **{_GROUP_COLUMNS[g]: getattr(row, _GROUP_COLUMNS[g]) for g in groups},
                    requests=int(row.requests),
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cached_tokens=int(row.cached_tokens),
                    reasoning_tokens=int(row.reasoning_tokens),
                    total_tokens=prompt + completion,
                )
            )
        return out

    def spent(self, key_id: str, now: float | None = None) -> Spent:
        now = time.time() if now is None else now
        day_start, month_start, day_end, month_end = windows(now)
        total = usage.c.prompt_tokens + usage.c.completion_tokens
        query = sa.select(
            sa.func.coalesce(sa.func.sum(sa.case((usage.c.at >= day_start, total), else_=0)), 0),
            sa.func.coalesce(sa.func.sum(total), 0),
        ).where(usage.c.key_id == key_id, usage.c.at >= month_start)
        with self.engine.connect() as db:
            day, month = db.execute(query).one()
        return Spent(int(day), int(month), day_end, month_end)

    # --- keys ----------------------------------------------------------------------------------

    def create_key(self, body: KeyCreate, now: float | None = None) -> KeyCreated:
        now = time.time() if now is None else now
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        expires_at = body.expires_at
        if expires_at is None and body.expires_in_s is not None:
            expires_at = now + body.expires_in_s
        key_id = "key_" + secrets.token_hex(8)
        with self.engine.begin() as db:
            db.execute(
                api_keys.insert().values(
                    id=key_id,
                    name=body.name,
                    digest=digest(secret),
                    models=None if body.models is None else json.dumps(body.models),
                    requests_per_minute=body.requests_per_minute,
                    tokens_per_day=body.budget.tokens_per_day,
                    tokens_per_month=body.budget.tokens_per_month,
                    max_parallel=body.budget.max_parallel,
                    expires_at=expires_at,
                    created_at=now,
                )
            )
        return KeyCreated(**self.get_key(key_id, now).model_dump(), key=secret)

    def get_key(self, key_id: str, now: float | None = None) -> KeyInfo:
        with self.engine.connect() as db:
            row = db.execute(sa.select(api_keys).where(api_keys.c.id == key_id)).one_or_none()
        if row is None:
            raise UnknownKeyError(key_id)
        return self._info(row, time.time() if now is None else now)

    def list_keys(self, now: float | None = None) -> list[KeyInfo]:
        now = time.time() if now is None else now
        with self.engine.connect() as db:
            rows = db.execute(sa.select(api_keys).order_by(api_keys.c.created_at)).all()
        return [self._info(r, now) for r in rows]

    def rotate_key(self, key_id: str, now: float | None = None) -> KeyCreated:
        """A new secret for the same id, name, models and budget; the old secret stops working."""
        now = time.time() if now is None else now
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        with self.engine.begin() as db:
            done = db.execute(
                api_keys.update()
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(digest=digest(secret), rotated_at=now)
            )
        if done.rowcount == 0:
            raise UnknownKeyError(key_id)
        return KeyCreated(**self.get_key(key_id, now).model_dump(), key=secret)

    def revoke_key(self, key_id: str, now: float | None = None) -> KeyInfo:
        """Revoked for good (kept, so its usage still names it); revoking twice changes nothing."""
        now = time.time() if now is None else now
        with self.engine.begin() as db:
            db.execute(
                api_keys.update()
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=now)
            )
        return self.get_key(key_id, now)

    def active_keys(self, now: float | None = None) -> list[StoredKey]:
        """What gateways authenticate against: keys neither revoked nor expired. (An expiry that
        passes later is checked by the gateway itself, per request.)"""
        now = time.time() if now is None else now
        with self.engine.connect() as db:
            rows = db.execute(sa.select(api_keys).where(api_keys.c.revoked_at.is_(None))).all()
        return [
            StoredKey(
                id=r.id,
                name=r.name,
                digest=r.digest,
                models=None if r.models is None else tuple(json.loads(r.models)),
                requests_per_minute=r.requests_per_minute,
                budget=_budget(r),
                expires_at=r.expires_at,
            )
            for r in rows
            if _key_state(r, now) == "active"
        ]

    def _info(self, row: Any, now: float) -> KeyInfo:
        return KeyInfo(
            id=row.id,
            name=row.name,
            models=_models(row),
            requests_per_minute=row.requests_per_minute,
            budget=_budget(row),
            created_at=row.created_at,
            expires_at=row.expires_at,
            rotated_at=row.rotated_at,
            revoked_at=row.revoked_at,
            state=_key_state(row, now),  # type: ignore[arg-type]
        )

    # --- audit ---------------------------------------------------------------------------------

    def append_audit(self, entries: Sequence[dict[str, Any]]) -> None:
        """Append only: nothing here updates or deletes an audit row."""
        if entries:
            with self.engine.begin() as db:
                db.execute(audit.insert(), list(entries))

    def audit_log(
        self, *, since: float | None = None, actor: str | None = None, limit: int = MAX_AUDIT_ROWS
    ) -> list[AuditEntry]:
        """The newest entries first."""
        query = sa.select(audit).order_by(audit.c.id.desc()).limit(min(limit, MAX_AUDIT_ROWS))
        if since is not None:
            query = query.where(audit.c.at >= since)
        if actor is not None:
            query = query.where(audit.c.actor == actor)
        with self.engine.connect() as db:
            rows = db.execute(query).all()
        return [AuditEntry.model_validate(r._asdict()) for r in rows]
