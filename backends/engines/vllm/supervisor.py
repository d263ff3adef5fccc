"""The replica's one AsyncLLM kept serving: a dead EngineCore replaced in place, a bounded number of times.

AsyncLLM runs the model in an EngineCore child process. If it dies, vLLM fails every in-flight
request with `EngineDeadError` and marks the engine errored; a watcher here notices (with or without
a request), builds a new engine in this same replica by the engine's own start-up, and gives up
after `MAX_ENGINE_RESTARTS`. Meanwhile, and after giving up, a caller asking for the engine gets a
typed error instead (`current`). A room of its own so engine.py reads as what is asked of the
engine, not as its life. Nothing here imports vLLM.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from raygate.backends.engines.base import loaded
from raygate.backends.engines.vllm.stats import CoreCounters
from raygate.backends.heap import freeze_startup_heap
from raygate.protocol.errors import EngineError, ServiceUnavailableError

log = logging.getLogger(__name__)

MAX_ENGINE_RESTARTS = 3
WATCH_INTERVAL_S = 1.0


class EngineSupervisor:
    """The AsyncLLM that `build` makes: started, watched, rebuilt after its EngineCore dies, and
    handed out only while it can serve."""

    def __init__(self, build: Callable[[], Awaitable[Any]], counters: CoreCounters) -> None:
        """`build`: a new AsyncLLM (the engine's start-up); `counters`: vLLM's scheduler counters,
        zeroed when the engine dies."""
        self._build = build
        self._counters = counters
        self.llm: Any = None  # None before the start and while a new engine is built
        self.restarts = 0
        self._watcher: asyncio.Task[None] | None = None
        self._failure: str | None = None  # set when the engine is gone for good

    async def start(self) -> None:
        self.llm = await self._build()
        self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        """Replace a dead EngineCore. vLLM's own monitor thread marks the engine dead; polling that
        flag once a second is cheap and needs no request to notice an idle engine's death."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            llm = self.llm
            if llm is None or not llm.errored:
                continue
            if self.restarts >= MAX_ENGINE_RESTARTS:
                self._failure = (
                    f"The model's engine failed {MAX_ENGINE_RESTARTS + 1} times; it is not restarted again."
                )
                log.error("%s", self._failure)
                return
            log.error("vLLM EngineCore died; starting a new engine in this replica")
            self.llm = None
            self.restarts += 1
            self._counters.scheduled(0, 0)
            await asyncio.to_thread(llm.shutdown)
            try:
                self.llm = await self._build()
                freeze_startup_heap()  # the new engine's objects, as the replica did at its start
            except Exception as exc:
                self._failure = f"The model's engine could not be restarted: {exc}"
                log.exception("could not restart the vLLM engine")
                return

    def current(self) -> Any:
        """The engine, or the typed error a request gets while there is none that serves."""
        if self._failure is not None:
            raise EngineError(self._failure, code="engine_dead")
        llm = self.llm
        if llm is None and self._watcher is not None:
            raise ServiceUnavailableError("The model's engine is restarting after a failure; retry shortly.")
        llm = loaded(llm)
        if llm.errored:
            raise EngineError("The model's engine has failed; retry shortly.", code="engine_dead")
        return llm
