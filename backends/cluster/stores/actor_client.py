"""A gateway's handle on one of the namespace's stores (stored responses, batches, the ledger: parts
of one actor, `host.py`): async calls, and an actor that died (Ray restarts it) looked up and
called again for a while."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from raygate.backends.cluster.runtime.errors import STORE_ERRORS, ErrorTable

log = logging.getLogger(__name__)

# A store that died is back within a second on an idle box and took ~10 s beside stress-ng: a
# request waits this long for it (a client that follows up at once should find its response),
# then gets 503 with a retry.
RESTART_WAIT_S = 30.0


class StoreActorClient:
    """`_call` one method of the actor; while it restarts (Ray answers "unavailable" at once, or
    it died under the call) it is looked up and called again, up to RESTART_WAIT_S, then 503."""

    what = "store"
    part = ""  # the store's method on the stores actor (`host.StoreHost`)
    errors: ErrorTable = STORE_ERRORS
    # A method that raised inside the actor: as it came (False), or through `errors` (True).
    map_task_errors = False

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._actor: Any = None

    async def start(self) -> dict[str, Any]:
        self._actor = await asyncio.to_thread(self._connect)
        info: dict[str, Any] = await self._call("info")
        return info

    async def _call(self, method: str, *args: Any, part: str | None = None) -> Any:
        """`method` of the store, through the stores actor's `part` method (the store's own
        unless told)."""
        deadline, pause = time.monotonic() + RESTART_WAIT_S, 0.1
        while True:
            try:
                return await getattr(self._actor, part or self.part).remote(method, *args)
            except RayActorError as exc:
                if time.monotonic() + pause > deadline:
                    raise self.errors.error(exc, self.what) from None
                log.warning("%s unreachable (%s); calling it again", self.what, type(exc).__name__)
            except RayTaskError as exc:
                if not self.map_task_errors:
                    raise
                raise self.errors.error(exc, self.what) from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
            self._actor = await asyncio.to_thread(self._connect)
