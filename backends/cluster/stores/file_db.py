"""The connection to `batches.sqlite3` (its three tables) and the uploaded files of the Files API.

Apart from the batches (`batch_db.py`) and their lines (`batch_lines.py`) because files stand on
their own: a client uploads, lists, reads and deletes them with no batch in sight, and a batch
only reads its input file and writes its output and error files through `_insert_file`. The
connection and schema live here, at the root of the classes, so every part shares one connection
(and so one transaction at a time).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Literal

from raygate.backends.cluster.stores.response_db import Transaction, connect
from raygate.protocol.errors import BadRequestError
from raygate.protocol.files import OpenAIFile

DB_FILE = "batches.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    content BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, created_at);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, created_at);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    claimer TEXT,
    lease_until REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    ok INTEGER,
    result TEXT,
    PRIMARY KEY (batch_id, idx)
);
CREATE INDEX IF NOT EXISTS lines_by_state ON lines (state, batch_id, idx);
"""


class QuotaExceededError(BadRequestError):
    """400: the upload would take the key's stored files past the quota."""

    default_code = "quota_exceeded"


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


class FileDB:
    """The connection, the schema, and the files table; `BatchDB` builds on it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._db = connect(path)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # --- files ---------------------------------------------------------------------------------

    def put_file(
        self,
        owner: str,
        filename: str,
        purpose: str,
        content: bytes,
        quota_bytes: int,
        now: float | None = None,
    ) -> OpenAIFile:
        """Store a file, unless the owner's files would pass `quota_bytes` (400)."""
        now = time.time() if now is None else now
        with Transaction(self._db):
            used = self.used_bytes(owner)
            if used + len(content) > quota_bytes:
                raise QuotaExceededError(
                    f"Storing this file ({len(content)} bytes) would exceed this key's file quota of "
                    f"{quota_bytes} bytes ({used} used). Delete files you no longer need.",
                    param="file",
                )
            file_id = self._insert_file(owner, filename, purpose, content, now)
        meta = self.get_file(file_id, owner)
        assert meta is not None
        return meta

    def _insert_file(self, owner: str, filename: str, purpose: str, content: bytes, now: float) -> str:
        file_id = new_id("file-")
        self._db.execute(
            "INSERT INTO files (id, owner, created_at, filename, purpose, bytes, content) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (file_id, owner, now, filename, purpose, len(content), content),
        )
        return file_id

    def used_bytes(self, owner: str) -> int:
        row = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM files WHERE owner = ?", (owner,))
        return int(row.fetchone()[0])

    def get_file(self, file_id: str, owner: str) -> OpenAIFile | None:
        row = self._db.execute(
            "SELECT id, created_at, filename, purpose, bytes FROM files WHERE id = ? AND owner = ?",
            (file_id, owner),
        ).fetchone()
        return None if row is None else _file(row)

    def file_content(self, file_id: str, owner: str) -> bytes | None:
        row = self._db.execute(
            "SELECT content FROM files WHERE id = ? AND owner = ?", (file_id, owner)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def list_files(
        self, owner: str, purpose: str | None, after: str | None, limit: int, order: Literal["asc", "desc"]
    ) -> tuple[list[OpenAIFile], bool]:
        """A page of the owner's files by creation time, after the file `after`; and whether
        more follow."""
        rows = self._db.execute(
            "SELECT id, created_at, filename, purpose, bytes FROM files WHERE owner = ? "
            "AND (? IS NULL OR purpose = ?) "
            f"ORDER BY created_at {'ASC' if order == 'asc' else 'DESC'}, rowid",
            (owner, purpose, purpose),
        ).fetchall()
        files = [_file(r) for r in rows]
        return paginate(files, after, limit)

    def delete_file(self, file_id: str, owner: str) -> bool:
        with Transaction(self._db):
            gone = self._db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        return gone.rowcount > 0


def _file(row: tuple[Any, ...]) -> OpenAIFile:
    return OpenAIFile(id=row[0], created_at=int(row[1]), filename=row[2], purpose=row[3], bytes=row[4])


def paginate(items: list[Any], after: str | None, limit: int) -> tuple[list[Any], bool]:
    if after is not None:
        ids = [item.id for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return items[:limit], len(items) > limit
