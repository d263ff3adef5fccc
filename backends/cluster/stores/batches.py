"""The cluster's one store of files and batches: the part of the stores actor (`host.py`) that owns
`batches.sqlite3` under `--state-dir` (`batch_db.BatchDB`), found by every gateway of the Ray
namespace by name, like the stored-responses actor (`responses.py`, whose docstring says why an
actor), and placed where the controller goes.

The batch state lives here rather than in a gateway so that it outlives any gateway: the gateways'
runners (`server/serving/batch_runner.py`) claim lines from it with a lease, and a line's result
is recorded here before it counts. A gateway that restarts mid-batch leaves its claims to lapse
(or hands them back when it stops cleanly), and whichever runner asks next takes them.

Typed errors raised by the database (404, 400) come back as values and are raised again by the
client, so the route answers with them as they are (an exception raised in the actor would reach
the gateway wrapped in Ray's `RayTaskError`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from raygate.backends.cluster.stores.actor_client import StoreActorClient
from raygate.backends.cluster.stores.batch_db import BatchDB
from raygate.backends.cluster.stores.batch_lines import ClaimedLine, FinishOutcome, LineResult
from raygate.backends.cluster.stores.file_db import DB_FILE
from raygate.protocol.batches import Batch, CreateBatchRequest
from raygate.protocol.errors import OpenAIError
from raygate.protocol.files import OpenAIFile

log = logging.getLogger(__name__)


class _Failed:
    """An `OpenAIError` raised in the actor, carried back as a value."""

    def __init__(self, error: OpenAIError) -> None:
        self.error = error


class BatchStore:
    """The actor: `BatchDB` behind Ray calls (one at a time, so one SQLite connection)."""

    def __init__(self, state_dir: str | None, window_s: float) -> None:
        path = Path(state_dir) / DB_FILE if state_dir else None
        self._db = BatchDB(path, window_s)
        log.info("batch store at %s", path or "memory")

    def info(self) -> dict[str, Any]:
        return {"path": str(self._db.path) if self._db.path else None, "pending": self._db.pending_lines()}

    def call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self._db, method)(*args)
        except OpenAIError as exc:
            return _Failed(exc)


class BatchStoreClient(StoreActorClient):
    """The gateway's handle on the store: one async method per `BatchDB` call it makes."""

    what = "batch store"
    part = "batches"

    async def _db(self, method: str, *args: Any) -> Any:
        result = await self._call("call", method, *args)
        if isinstance(result, _Failed):
            raise result.error
        return result

    async def put_file(
        self, owner: str, filename: str, purpose: str, content: bytes, quota_bytes: int
    ) -> OpenAIFile:
        found: OpenAIFile = await self._db("put_file", owner, filename, purpose, content, quota_bytes)
        return found

    async def get_file(self, file_id: str, owner: str) -> OpenAIFile | None:
        found: OpenAIFile | None = await self._db("get_file", file_id, owner)
        return found

    async def file_content(self, file_id: str, owner: str) -> bytes | None:
        content: bytes | None = await self._db("file_content", file_id, owner)
        return content

    async def list_files(
        self, owner: str, purpose: str | None, after: str | None, limit: int, order: Literal["asc", "desc"]
    ) -> tuple[list[OpenAIFile], bool]:
        page: tuple[list[OpenAIFile], bool] = await self._db(
            "list_files", owner, purpose, after, limit, order
        )
        return page

    async def delete_file(self, file_id: str, owner: str) -> bool:
        deleted: bool = await self._db("delete_file", file_id, owner)
        return deleted

    async def create_batch(self, owner: str, request: CreateBatchRequest) -> Batch:
        batch: Batch = await self._db("create_batch", owner, request)
        return batch

    async def get_batch(self, batch_id: str, owner: str) -> Batch | None:
        batch: Batch | None = await self._db("get_batch", batch_id, owner)
        return batch

    async def list_batches(self, owner: str, after: str | None, limit: int) -> tuple[list[Batch], bool]:
        page: tuple[list[Batch], bool] = await self._db("list_batches", owner, after, limit)
        return page

    async def all_batches(self) -> list[tuple[str, Batch]]:
        batches: list[tuple[str, Batch]] = await self._db("all_batches")
        return batches

    async def cancel_batch(self, batch_id: str, owner: str) -> Batch:
        batch: Batch = await self._db("cancel_batch", batch_id, owner)
        return batch

    async def claim(self, runner: str, limit: int, lease_s: float) -> list[ClaimedLine]:
        lines: list[ClaimedLine] = await self._db("claim", runner, limit, lease_s)
        return lines

    async def renew(self, runner: str, lines: list[tuple[str, int]], lease_s: float) -> None:
        await self._db("renew", runner, lines, lease_s)

    async def release(self, runner: str) -> None:
        await self._db("release", runner)

    async def finish(self, runner: str, batch_id: str, index: int, result: LineResult) -> FinishOutcome:
        outcome: FinishOutcome = await self._db("finish", runner, batch_id, index, result)
        return outcome

    async def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = await self._db("status_counts")
        return counts

    async def tick(self) -> None:
        await self._db("tick")
