"""The cluster's one store of responses, the part of the stores actor (`host.py`) that owns the
SQLite file.

Why an actor: `previous_response_id` and `GET /v1/responses/{id}` must work on whichever gateway
the load balancer picks, and gateways may run on different nodes. Every gateway in a Ray namespace
finds the same actor by name (as it finds the controller), so they share one database without a
shared file system, and only one process ever opens the file (SQLite's locking is not to be
trusted across machines or on network mounts). Like the controller, the actor is pinned to the
node of the gateway that created it, so `--state-dir` is that gateway's directory; without one the
database lives in the actor's memory. A dead actor is restarted by Ray and reopens the file.

A write is one small transaction on a thread of its own (the actor runs one call at a time), well
under a millisecond next to a generation; the gateway awaits it before answering, so a client
that follows up at once (agents do) always finds its response.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from raygate.backends.cluster.stores.actor_client import StoreActorClient
from raygate.backends.cluster.stores.response_db import DB_FILE, ResponseDB, StoreLimits

log = logging.getLogger(__name__)


class ResponseStore:
    """The actor: `ResponseDB` behind Ray calls (one at a time, so one SQLite connection)."""

    def __init__(self, state_dir: str | None, max_age_s: float, max_bytes: int) -> None:
        path = Path(state_dir) / DB_FILE if state_dir else None
        self._db = ResponseDB(path, StoreLimits(max_age_s, max_bytes))
        log.info("response store at %s (%d stored)", path or "memory", self._db.count())

    def info(self) -> dict[str, Any]:
        return {
            "path": str(self._db.path) if self._db.path else None,
            "max_age_s": self._db.limits.max_age_s,
            "max_bytes": self._db.limits.max_bytes,
            "count": self._db.count(),
            "bytes": self._db.total_bytes,
        }

    def put(self, response_id: str, owner: str, body: str) -> None:
        self._db.put(response_id, owner, body)

    def get(self, response_id: str, owner: str) -> str | None:
        return self._db.get(response_id, owner)

    def delete(self, response_id: str, owner: str) -> bool:
        return self._db.delete(response_id, owner)


class ResponseStoreClient(StoreActorClient):
    """The gateway's handle on the store (retries while it restarts: `StoreActorClient`)."""

    what = "response store"
    part = "responses"

    async def put(self, response_id: str, owner: str, body: str) -> None:
        await self._call("put", response_id, owner, body)

    async def get(self, response_id: str, owner: str) -> str | None:
        body: str | None = await self._call("get", response_id, owner)
        return body

    async def delete(self, response_id: str, owner: str) -> bool:
        deleted: bool = await self._call("delete", response_id, owner)
        return deleted
