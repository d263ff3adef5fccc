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

`BatchDB` is built in three modules, one part each: the connection, the schema and the files
(`file_db.FileDB`), the runners' side of the lines (`batch_lines.BatchLineDB`), and, here, the
batches' own calls over both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from raygate.backends.cluster.stores.batch_lines import BatchLineDB
from raygate.backends.cluster.stores.file_db import new_id, paginate
from raygate.backends.cluster.stores.response_db import Transaction
from raygate.protocol.batches import (
    BATCH_STATUSES,
    FINAL_STATUSES,
    Batch,
    BatchError,
    BatchErrors,
    BatchNotFoundError,
    BatchRequestCounts,
    CreateBatchRequest,
    parse_batch_lines,
)
from raygate.protocol.errors import BadRequestError
from raygate.protocol.files import NoSuchFileError


class BatchDB(BatchLineDB):
    """Files, batches and lines (see the module docstring). `now` parameters are for tests."""

    def __init__(self, path: Path | None, window_s: float) -> None:
        super().__init__(path)
        self.window_s = window_s

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
            id=new_id("batch_"),
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
        page, more = paginate([Batch.model_validate_json(r[0]) for r in rows], after, limit)
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

    def status_counts(self) -> dict[str, int]:
        """Batches by status, every status present (zero when none)."""
        rows = self._db.execute("SELECT status, COUNT(*) FROM batches GROUP BY status")
        return {**dict.fromkeys(BATCH_STATUSES, 0), **dict(rows.fetchall())}

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
