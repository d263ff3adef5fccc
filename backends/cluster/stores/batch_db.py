"""The SQLite database of the Files and Batch APIs: uploaded files, batches, and each batch line's
state and result.

Three tables. `files`: one row per file (its owner, a key digest as in `response_db`; its bytes).
`batches`: one row per batch, its OpenAI object as JSON beside the columns queries need. `lines`:
one row per input line of a batch, `pending` -> `claimed` (by one runner, until its lease ends)
-> `done` with its result. A line's result is written in the same transaction that marks it
done, and the counts a client sees are read from these rows, so a line is counted only once its
result is on disk; a line is claimed only while it is not done, so a finished line never runs
again, and a claim whose runner died (a gateway restart) lapses with its lease and is claimed
again, so none is lost.

Output and error files are built in the transaction that records a batch's last line (or that
expires or cancels it): a batch is never `completed` without its files.

Only the store actor (`batches.py`) opens the file, one call at a time; `path` None keeps
everything in memory for the actor's life.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from raygate.backends.cluster.stores.response_db import Transaction
from raygate.protocol.batches import (
    BATCH_STATUSES,
    FINAL_STATUSES,
    Batch,
    BatchError,
    BatchErrors,
    BatchLineResponse,
    BatchNotFoundError,
    BatchOutputLine,
    BatchRequestCounts,
    CreateBatchRequest,
    parse_batch_lines,
)
from raygate.protocol.errors import BadRequestError
from raygate.protocol.files import NoSuchFileError, OpenAIFile
from raygate.protocol.text import one_line

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

# A line that failed with a server error (a replica died under it) runs once more, then its
# error is its result.
MAX_ATTEMPTS = 2
FinishOutcome = Literal["recorded", "retry", "dropped"]


class QuotaExceededError(BadRequestError):
    """400: the upload would take the key's stored files past the quota."""

    default_code = "quota_exceeded"


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    """One line handed to a runner: where it goes, for whom, and with what body."""

    batch_id: str
    index: int
    custom_id: str
    owner: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LineResult:
    """What running a line gave: the endpoint's status, request id and JSON body."""

    status_code: int
    request_id: str
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    @property
    def retryable(self) -> bool:
        """A server-side failure (a replica died, a timeout): worth one more try."""
        return self.status_code >= 500


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


class BatchDB:
    """Files, batches and lines (see the module docstring). `now` parameters are for tests."""

    def __init__(self, path: Path | None, window_s: float) -> None:
        self.path = path
        self.window_s = window_s
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            ":memory:" if path is None else str(path), isolation_level=None, check_same_thread=False
        )
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
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
        file_id = _new_id("file-")
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
        return _page(files, after, limit)

    def delete_file(self, file_id: str, owner: str) -> bool:
        with Transaction(self._db):
            gone = self._db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        return gone.rowcount > 0

    # --- batches -------------------------------------------------------------------------------

    def create_batch(self, owner: str, request: CreateBatchRequest, now: float | None = None) -> Batch:
        """A new batch over the owner's input file: `in_progress` with one pending row per line, or
        `failed` with the lines' errors (OpenAI's `validating` ends here, in the same call)."""
        now = time.time() if now is None else now
        meta = self.get_file(request.input_file_id, owner)
        content = self.file_content(request.input_file_id, owner)
        if meta is None or content is None:
            raise NoSuchFileError.for_id(request.input_file_id)
        if meta.purpose != "batch":
            raise BadRequestError(
                f"File {meta.id} was uploaded with purpose `{meta.purpose}`, not `batch`.",
                param="input_file_id",
            )
        batch = Batch(
            id=_new_id("batch_"),
            endpoint=request.endpoint,
            input_file_id=request.input_file_id,
            completion_window=request.completion_window,
            status="in_progress",
            created_at=int(now),
            in_progress_at=int(now),
            expires_at=int(now + self.window_s),
            metadata=request.metadata,
        )
        lines, errors = parse_batch_lines(content, request.endpoint)
        if not errors and not lines:
            errors = [BatchError(code="empty_file", message="The input file holds no request.")]
        models = {str(line.body.get("model")) for line in lines}
        batch.model = models.pop() if len(models) == 1 else None
        if errors:
            batch.status, batch.failed_at, batch.in_progress_at = "failed", int(now), None
            batch.errors = BatchErrors(data=errors[:100])
        with Transaction(self._db):
            self._db.execute(
                "INSERT INTO batches (id, owner, created_at, status, body) VALUES (?, ?, ?, ?, ?)",
                (batch.id, owner, now, batch.status, batch.model_dump_json()),
            )
            if not errors:
                self._db.executemany(
                    "INSERT INTO lines (batch_id, idx, custom_id, request, state) "
                    "VALUES (?, ?, ?, ?, 'pending')",
                    ((batch.id, i, line.custom_id, json.dumps(line.body)) for i, line in enumerate(lines)),
                )
        batch.request_counts = BatchRequestCounts(total=len(lines) if not errors else 0)
        return batch

    def get_batch(self, batch_id: str, owner: str) -> Batch | None:
        row = self._db.execute(
            "SELECT body FROM batches WHERE id = ? AND owner = ?", (batch_id, owner)
        ).fetchone()
        return None if row is None else self._with_counts(Batch.model_validate_json(row[0]))

    def list_batches(self, owner: str, after: str | None, limit: int) -> tuple[list[Batch], bool]:
        rows = self._db.execute(
            "SELECT body FROM batches WHERE owner = ? ORDER BY created_at DESC, rowid DESC", (owner,)
        ).fetchall()
        page, more = _page([Batch.model_validate_json(r[0]) for r in rows], after, limit)
        return [self._with_counts(b) for b in page], more

    def all_batches(self) -> list[tuple[str, Batch]]:
        """Every owner's batches (the console and the metrics count them by status)."""
        rows = self._db.execute("SELECT owner, body FROM batches ORDER BY created_at DESC").fetchall()
        return [(r[0], self._with_counts(Batch.model_validate_json(r[1]))) for r in rows]

    def cancel_batch(self, batch_id: str, owner: str, now: float | None = None) -> Batch:
        """Stop claiming the batch's lines; once no claimed line is left, it is `cancelled` with
        what finished (`tick`). Cancelling a batch that has ended is a 409 unless it was cancelled."""
        now = time.time() if now is None else now
        batch = self.get_batch(batch_id, owner)
        if batch is None:
            raise BatchNotFoundError.for_id(batch_id)
        if batch.status in ("cancelling", "cancelled"):
            return batch
        if batch.status in FINAL_STATUSES:
            raise BadRequestError(
                f"Cannot cancel a batch with status `{batch.status}`.",
                param="batch_id",
                code="batch_not_cancellable",
            )
        batch.status, batch.cancelling_at = "cancelling", int(now)
        with Transaction(self._db):
            self._save(batch)
        self.tick(now)
        found = self.get_batch(batch_id, owner)
        assert found is not None
        return found

    # --- running lines -------------------------------------------------------------------------

    def claim(self, runner: str, limit: int, lease_s: float, now: float | None = None) -> list[ClaimedLine]:
        """Up to `limit` lines for `runner`, oldest batch first: pending ones, and claimed ones
        whose lease has lapsed (their runner is gone)."""
        now = time.time() if now is None else now
        with Transaction(self._db):
            rows = self._db.execute(
                "SELECT l.batch_id, l.idx, l.custom_id, b.owner, l.request, b.body FROM lines l "
                "JOIN batches b ON b.id = l.batch_id WHERE b.status = 'in_progress' "
                "AND (l.state = 'pending' OR (l.state = 'claimed' AND l.lease_until < ?)) "
                "ORDER BY b.created_at, l.batch_id, l.idx LIMIT ?",
                (now, limit),
            ).fetchall()
            self._db.executemany(
                "UPDATE lines SET state = 'claimed', claimer = ?, lease_until = ? "
                "WHERE batch_id = ? AND idx = ?",
                ((runner, now + lease_s, r[0], r[1]) for r in rows),
            )
        return [
            ClaimedLine(r[0], r[1], r[2], r[3], json.loads(r[5])["endpoint"], json.loads(r[4])) for r in rows
        ]

    def renew(
        self, runner: str, lines: list[tuple[str, int]], lease_s: float, now: float | None = None
    ) -> int:
        """Extend `runner`'s leases on `lines` (`(batch_id, index)`: the ones it is still running;
        a line it lost track of lapses)."""
        now = time.time() if now is None else now
        renewed = 0
        with Transaction(self._db):
            for batch_id, index in lines:
                cur = self._db.execute(
                    "UPDATE lines SET lease_until = ? "
                    "WHERE batch_id = ? AND idx = ? AND state = 'claimed' AND claimer = ?",
                    (now + lease_s, batch_id, index, runner),
                )
                renewed += cur.rowcount
        return renewed

    def release(self, runner: str) -> int:
        """Hand back `runner`'s unfinished lines at once (a gateway that stops cleanly)."""
        with Transaction(self._db):
            cur = self._db.execute(
                "UPDATE lines SET state = 'pending', claimer = NULL, lease_until = NULL "
                "WHERE state = 'claimed' AND claimer = ?",
                (runner,),
            )
        return cur.rowcount

    def finish(
        self, runner: str, batch_id: str, index: int, result: LineResult, now: float | None = None
    ) -> FinishOutcome:
        """Record a line's result ("recorded"), or, for a first server error, put the line back for
        one more try ("retry"). "dropped": the line was not this runner's to finish (its lease
        lapsed and another runner took it, or the batch ended), so no line is recorded twice."""
        now = time.time() if now is None else now
        with Transaction(self._db):
            row = self._db.execute(
                "SELECT l.attempts, b.status FROM lines l JOIN batches b ON b.id = l.batch_id "
                "WHERE l.batch_id = ? AND l.idx = ? AND l.state = 'claimed' AND l.claimer = ?",
                (batch_id, index, runner),
            ).fetchone()
            if row is None or row[1] not in ("in_progress", "cancelling"):
                return "dropped"
            attempts = row[0] + 1
            if result.retryable and attempts < MAX_ATTEMPTS and row[1] == "in_progress":
                self._db.execute(
                    "UPDATE lines SET state = 'pending', claimer = NULL, lease_until = NULL, attempts = ? "
                    "WHERE batch_id = ? AND idx = ?",
                    (attempts, batch_id, index),
                )
                return "retry"
            response = BatchLineResponse(
                status_code=result.status_code, request_id=result.request_id, body=result.body
            )
            self._db.execute(
                "UPDATE lines SET state = 'done', claimer = NULL, lease_until = NULL, attempts = ?, ok = ?, "
                "result = ? WHERE batch_id = ? AND idx = ?",
                (attempts, int(result.ok), response.model_dump_json(), batch_id, index),
            )
            self._finish_if_done(batch_id, now)
        return "recorded"

    def tick(self, now: float | None = None) -> None:
        """Time-driven changes: batches past their window expire (what finished is kept, the rest
        is written to the error file as `batch_expired`); cancelling batches with no claimed line
        left are cancelled."""
        now = time.time() if now is None else now
        rows = self._db.execute(
            "SELECT id, body FROM batches WHERE status IN ('in_progress', 'cancelling')"
        ).fetchall()
        for batch_id, body in rows:
            batch = Batch.model_validate_json(body)
            with Transaction(self._db):
                if batch.expires_at is not None and now >= batch.expires_at:
                    self._finalize(batch, "expired", now)
                elif batch.status == "cancelling":
                    live = self._db.execute(
                        "SELECT COUNT(*) FROM lines "
                        "WHERE batch_id = ? AND state = 'claimed' AND lease_until >= ?",
                        (batch_id, now),
                    ).fetchone()[0]
                    if not live:
                        self._finalize(batch, "cancelled", now)

    def status_counts(self) -> dict[str, int]:
        """Batches by status, every status present (zero when none)."""
        rows = self._db.execute("SELECT status, COUNT(*) FROM batches GROUP BY status")
        return {**dict.fromkeys(BATCH_STATUSES, 0), **dict(rows.fetchall())}

    def pending_lines(self) -> int:
        """Lines of running batches not finished yet (what the runners still have to do)."""
        row = self._db.execute(
            "SELECT COUNT(*) FROM lines l JOIN batches b ON b.id = l.batch_id "
            "WHERE b.status = 'in_progress' AND l.state != 'done'"
        ).fetchone()
        return int(row[0])

    # --- inside -------------------------------------------------------------------------------

    def _with_counts(self, batch: Batch) -> Batch:
        total, completed, failed = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(ok = 1), 0), COALESCE(SUM(ok = 0), 0) "
            "FROM lines WHERE batch_id = ?",
            (batch.id,),
        ).fetchone()
        if total or batch.status != "failed":
            batch.request_counts = BatchRequestCounts(total=total, completed=completed, failed=failed)
        return batch

    def _save(self, batch: Batch) -> None:
        self._db.execute(
            "UPDATE batches SET status = ?, body = ? WHERE id = ?",
            (batch.status, batch.model_dump_json(), batch.id),
        )

    def _finish_if_done(self, batch_id: str, now: float) -> None:
        left = self._db.execute(
            "SELECT COUNT(*) FROM lines WHERE batch_id = ? AND state != 'done'", (batch_id,)
        ).fetchone()[0]
        if left:
            return
        row = self._db.execute("SELECT body FROM batches WHERE id = ?", (batch_id,)).fetchone()
        batch = Batch.model_validate_json(row[0])
        self._finalize(batch, "cancelled" if batch.status == "cancelling" else "completed", now)

    def _finalize(
        self, batch: Batch, status: Literal["completed", "expired", "cancelled"], now: float
    ) -> None:
        """Write the output and error files and end the batch (inside the caller's transaction)."""
        owner = self._db.execute("SELECT owner FROM batches WHERE id = ?", (batch.id,)).fetchone()[0]
        if status == "expired":
            expired = BatchError(
                code="batch_expired",
                message="This request could not be executed before the completion window expired.",
            )
            self._db.execute(
                "UPDATE lines SET state = 'done', claimer = NULL, ok = 0, result = ? "
                "WHERE batch_id = ? AND state != 'done'",
                (json.dumps({"error": expired.model_dump()}), batch.id),
            )
        rows = self._db.execute(
            "SELECT custom_id, ok, result FROM lines WHERE batch_id = ? AND state = 'done' ORDER BY idx",
            (batch.id,),
        ).fetchall()
        outputs: list[str] = []
        errors: list[str] = []
        for custom_id, ok, result in rows:
            recorded = json.loads(result)
            if "error" in recorded and "status_code" not in recorded:
                line = BatchOutputLine(
                    id=_new_id("batch_req_"), custom_id=custom_id, error=BatchError(**recorded["error"])
                )
            else:
                line = BatchOutputLine(
                    id=_new_id("batch_req_"), custom_id=custom_id, response=BatchLineResponse(**recorded)
                )
            (outputs if ok else errors).append(line.model_dump_json())
        stamp = int(now)
        batch.finalizing_at = stamp
        if outputs:
            batch.output_file_id = self._insert_file(
                owner, f"{batch.id}_output.jsonl", "batch_output", _jsonl(outputs), now
            )
        if errors:
            batch.error_file_id = self._insert_file(
                owner, f"{batch.id}_error.jsonl", "batch_output", _jsonl(errors), now
            )
        batch.status = status
        if status == "completed":
            batch.completed_at = stamp
        elif status == "expired":
            batch.expired_at = stamp
        else:
            batch.cancelled_at = stamp
        self._save(batch)


def _jsonl(lines: list[str]) -> bytes:
    """One JSON object a line, none of them split by a reader that breaks lines at U+2028 too
    (`str.splitlines()`, httpx's `iter_lines()`): protocol/text.py's `one_line`."""
    return ("\n".join(one_line(line) for line in lines) + "\n").encode()


def _file(row: tuple[Any, ...]) -> OpenAIFile:
    return OpenAIFile(id=row[0], created_at=int(row[1]), filename=row[2], purpose=row[3], bytes=row[4])


def _page(items: list[Any], after: str | None, limit: int) -> tuple[list[Any], bool]:
    if after is not None:
        ids = [item.id for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return items[:limit], len(items) > limit
