"""The cluster's one store of responses: a named, detached Ray actor that owns the SQLite file.

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

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from raygate.backends.cluster.runtime.errors import STORE_ERRORS
from raygate.backends.cluster.runtime.placement import state_actor_options
from raygate.backends.cluster.stores.response_db import DB_FILE, ResponseDB, StoreLimits

log = logging.getLogger(__name__)

STORE_NAME = "responses"
# A store that died is back within a second on an idle box and took ~10 s beside stress-ng: a
# request waits this long for it (a client that follows up at once should find its response),
# then gets 503 with a retry.
RESTART_WAIT_S = 30.0


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


def connect_response_store(
    state_dir: Path | None, limits: StoreLimits, state_resource: str | None = None
) -> Any:
    """The namespace's store: the existing actor, or a new one where the controller goes
    (`placement.state_actor_options`). Get-or-create is
    atomic in Ray, so gateways starting together still share one."""
    return (
        ray.remote(ResponseStore)
        .options(
            name=STORE_NAME,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_restarts=-1,
            **state_actor_options(state_resource),
        )
        .remote(str(state_dir) if state_dir else None, limits.max_age_s, limits.max_bytes)
    )


class ResponseStoreClient:
    """The gateway's handle on the store: async calls; a lost actor is looked up again once."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._actor: Any = None

    async def start(self) -> dict[str, Any]:
        self._actor = await asyncio.to_thread(self._connect)
        info: dict[str, Any] = await self._actor.info.remote()
        return info

    async def put(self, response_id: str, owner: str, body: str) -> None:
        await self._call("put", response_id, owner, body)

    async def get(self, response_id: str, owner: str) -> str | None:
        body: str | None = await self._call("get", response_id, owner)
        return body

    async def delete(self, response_id: str, owner: str) -> bool:
        deleted: bool = await self._call("delete", response_id, owner)
        return deleted

    async def _call(self, method: str, *args: Any) -> Any:
        """One call; while the actor restarts (Ray answers "unavailable" at once, or it died under
        the call) it is looked up and called again, up to RESTART_WAIT_S, then 503."""
        deadline, pause = time.monotonic() + RESTART_WAIT_S, 0.1
        while True:
            try:
                return await getattr(self._actor, method).remote(*args)
            except RayActorError as exc:
                if time.monotonic() + pause > deadline:
                    raise STORE_ERRORS.error(exc, "response store") from None
                log.warning("response store unreachable (%s); calling it again", type(exc).__name__)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
            self._actor = await asyncio.to_thread(self._connect)
