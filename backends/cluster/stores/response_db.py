"""The SQLite database of stored responses (`POST /v1/responses` with `store: true`).

One table, one row per response: its id, the API key that created it (`owner`, a digest; "" on a
gateway without keys), when, its size, and its JSON (`raygate.protocol.response_object.StoredResponse`, opaque
here). Reads match the id *and* the owner, so another key's response is as absent as an unknown
one. The database is bounded by age (`max_age_s`: older rows are deleted, and never returned) and
by size (`max_bytes` of JSON: the oldest rows go first).

Only the store actor (`responses.py`) opens the file, from one thread, so there is no
cross-process locking to trust (SQLite's locks are unreliable on network file systems). `path`
None keeps the database in memory: it lasts as long as the actor.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

DB_FILE = "responses.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    size INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at);
"""


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """How long a response is kept, and how many bytes of responses at most."""

    max_age_s: float
    max_bytes: int


class ResponseDB:
    """Put, get and delete stored responses under `StoreLimits` (see the module docstring)."""

    def __init__(self, path: Path | None, limits: StoreLimits) -> None:
        self.path = path
        self.limits = limits
        self._db = connect(path)
        self._db.executescript(_SCHEMA)
        self._bytes = int(self._db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0])
        self.expire()

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def put(self, response_id: str, owner: str, body: str, now: float | None = None) -> None:
        """Store (or replace) a response, then evict what the limits no longer allow."""
        now = time.time() if now is None else now
        size = len(body.encode())
        with self._transaction():
            old = self._db.execute("SELECT size FROM responses WHERE id = ?", (response_id,)).fetchone()
            self._db.execute(
                "INSERT OR REPLACE INTO responses (id, owner, created_at, size, body) VALUES (?, ?, ?, ?, ?)",
                (response_id, owner, now, size, body),
            )
        self._bytes += size - (old[0] if old else 0)
        self.expire(now)

    def get(self, response_id: str, owner: str, now: float | None = None) -> str | None:
        """The body, or None if there is none for this owner (or it has expired)."""
        row = self._db.execute(
            "SELECT body FROM responses WHERE id = ? AND owner = ? AND created_at >= ?",
            (response_id, owner, self._oldest(now)),
        ).fetchone()
        return None if row is None else str(row[0])

    def delete(self, response_id: str, owner: str) -> bool:
        """Delete this owner's response; False if there was none."""
        with self._transaction():
            row = self._db.execute(
                "SELECT size FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
            ).fetchone()
            if row is None:
                return False
            self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        self._bytes -= row[0]
        return True

    def expire(self, now: float | None = None) -> int:
        """Delete rows past the age limit, then the oldest rows until the size limit holds."""
        removed = 0
        with self._transaction():
            oldest = self._oldest(now)
            gone = self._db.execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM responses WHERE created_at < ?", (oldest,)
            ).fetchone()
            if gone[1]:
                self._db.execute("DELETE FROM responses WHERE created_at < ?", (oldest,))
                self._bytes -= gone[0]
                removed += gone[1]
            while self._bytes > self.limits.max_bytes:
                rows = self._db.execute(
                    "SELECT id, size FROM responses ORDER BY created_at LIMIT 64"
                ).fetchall()
                if not rows:
                    self._bytes = 0
                    break
                for rid, size in rows:
                    if self._bytes <= self.limits.max_bytes:
                        break
                    self._db.execute("DELETE FROM responses WHERE id = ?", (rid,))
                    self._bytes -= size
                    removed += 1
        return removed

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def _oldest(self, now: float | None) -> float:
        return (time.time() if now is None else now) - self.limits.max_age_s

    def _transaction(self) -> Transaction:
        return Transaction(self._db)


def connect(path: Path | None) -> sqlite3.Connection:
    """A store's SQLite connection (in memory when `path` is None), transactions explicit
    (`Transaction`). One call at a time uses it (the actor's), though not always from one thread."""
    if path is None:
        return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    # WAL: a write does not rewrite the database; NORMAL: durable across a process crash (only a
    # power cut can lose the last transactions), at a fraction of FULL's fsyncs.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class Transaction:
    """BEGIN ... COMMIT (ROLLBACK on an exception): with `isolation_level=None` nothing is implicit."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
