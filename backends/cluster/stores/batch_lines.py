"""Running a batch's lines: claims and their leases, results, and the end of a batch that
follows from them (its output and error files written in the transaction that ends it).

Apart from the batches' own calls (`batch_db.py`: create, read, list, cancel) because this is the
runners' side of the store, the part that changes a line's state; `BatchDB` inherits it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from raygate.backends.cluster.stores.file_db import FileDB, new_id
from raygate.backends.cluster.stores.response_db import Transaction
from raygate.protocol.batches import Batch, BatchError, BatchLineResponse, BatchOutputLine
from raygate.protocol.text import one_line

# A line that failed with a server error (a replica died under it) runs once more, then its
# error is its result.
MAX_ATTEMPTS = 2
FinishOutcome = Literal["recorded", "retry", "dropped"]


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


class BatchLineDB(FileDB):
    """Claims, leases, results and a batch's end (see the module docstring)."""

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

    def pending_lines(self) -> int:
        """Lines of running batches not finished yet (what the runners still have to do)."""
        row = self._db.execute(
            "SELECT COUNT(*) FROM lines l JOIN batches b ON b.id = l.batch_id "
            "WHERE b.status = 'in_progress' AND l.state != 'done'"
        ).fetchone()
        return int(row[0])

    # --- inside -------------------------------------------------------------------------------

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
                    id=new_id("batch_req_"), custom_id=custom_id, error=BatchError(**recorded["error"])
                )
            else:
                line = BatchOutputLine(
                    id=new_id("batch_req_"), custom_id=custom_id, response=BatchLineResponse(**recorded)
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
