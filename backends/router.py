"""Routing one model's requests over its replica actors, and carrying deltas back over Ray.

Least-loaded choice uses the gateway's own count of in-flight requests per replica: it is exact
for this process and costs no round trip. Closing a stream early (client disconnect) cancels the
Ray generator task, which closes the engine's stream inside the replica.

A replica whose actor died (killed, OOM, node lost) leaves the rotation the first time a call
notices, and the router asks the registry for a replacement in the background. A request that
found the dead actor before receiving anything is retried once on another replica: nothing has
reached the client yet, so the retry is invisible. After the first delta the stream ends with a
503 error instead (the client has already seen part of an answer).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from protocol.config import ModelConfig
from protocol.errors import EngineError, OpenAIError, ServiceUnavailableError
from protocol.generation import Delta, EmbedRequest, EmbedResult, GenerateRequest

log = logging.getLogger(__name__)


@dataclass
class Replica:
    actor: Any
    index: int
    node_id: str = ""
    context_length: int = 0
    inflight: int = field(default=0)

# Starts a fresh replica for slot `index` (see ModelRegistry.start_replica).
ReplicaStarter = Callable[[ModelConfig, int], Awaitable[Replica]]


def _unwrap(exc: Exception, model: str) -> OpenAIError:
    """Errors from a replica arrive wrapped by Ray; clients see the engine's own typed error."""
    if isinstance(exc, RayTaskError):
        cause = exc.cause
        if isinstance(cause, OpenAIError):
            return type(cause)(cause.message, param=cause.param, code=cause.code)
        if isinstance(cause, RayActorError):
            exc = cause
        else:
            return EngineError(f"Model `{model}` failed: {cause}")
    if isinstance(exc, RayActorError):
        return ServiceUnavailableError(
            f"The replica serving `{model}` stopped while handling the request; please retry."
        )
    if isinstance(exc, OpenAIError):
        return exc
    return EngineError(f"Model `{model}` failed: {exc}")


class ModelRouter:
    def __init__(
        self, config: ModelConfig, replicas: list[Replica], start_replica: ReplicaStarter | None = None
    ) -> None:
        self.config = config
        self.replicas = replicas
        self.restarts = 0  # replicas replaced after their actor died
        self._tiebreak = itertools.count()
        self._start_replica = start_replica
        self._replacing: set[asyncio.Task[None]] = set()

    def _pick(self) -> Replica:
        if not self.replicas:
            raise ServiceUnavailableError(f"Model `{self.config.name}` has no ready replica.")
        low = min(r.inflight for r in self.replicas)
        candidates = [r for r in self.replicas if r.inflight == low]
        return candidates[next(self._tiebreak) % len(candidates)]

    def mark_dead(self, replica: Replica) -> None:
        """Take a replica whose actor died out of rotation and start its replacement (once)."""
        if not any(r is replica for r in self.replicas):
            return
        self.replicas = [r for r in self.replicas if r is not replica]
        log.warning("model %s: replica %d died; replacing it", self.config.name, replica.index)
        if self._start_replica is not None:
            task = asyncio.create_task(self._replace(replica.index))
            self._replacing.add(task)
            task.add_done_callback(self._replacing.discard)

    async def _replace(self, index: int) -> None:
        assert self._start_replica is not None
        for attempt in range(5):
            try:
                replica = await self._start_replica(self.config, index)
            except Exception as exc:
                log.error("model %s: replacing replica %d failed (%s)", self.config.name, index, exc)
                await asyncio.sleep(2**attempt)
                continue
            self.replicas = [*self.replicas, replica]
            self.restarts += 1
            log.info("model %s: replica %d replaced", self.config.name, index)
            return

    def cancel_replacements(self) -> None:
        for task in self._replacing:
            task.cancel()

    async def check(self) -> None:
        """Ask every replica whether its engine can serve; dead actors leave the rotation."""

        async def one(replica: Replica) -> None:
            try:
                await asyncio.wait_for(replica.actor.check_health.remote(), timeout=5)
            except RayActorError:
                self.mark_dead(replica)
            except (RayTaskError, TimeoutError) as exc:
                log.warning("model %s: replica %d unhealthy: %s", self.config.name, replica.index, exc)

        await asyncio.gather(*(one(r) for r in self.replicas))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        for attempt in range(2):
            replica = self._pick()
            replica.inflight += 1
            stream = replica.actor.generate.options(num_returns="streaming").remote(request)
            finished = False
            sent = False
            try:
                async for ref in stream:
                    for delta in await ref:
                        sent = True
                        yield delta
                finished = True
                return
            except (RayTaskError, RayActorError) as exc:
                finished = True
                died = isinstance(exc, RayActorError) or isinstance(getattr(exc, "cause", None), RayActorError)
                if died:
                    self.mark_dead(replica)
                    if not sent and attempt == 0 and self.replicas:
                        continue  # nothing reached the client: try a live replica
                raise _unwrap(exc, self.config.name) from None
            finally:
                replica.inflight -= 1
                if not finished:
                    ray.cancel(stream)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        for attempt in range(2):
            replica = self._pick()
            replica.inflight += 1
            try:
                result: EmbedResult = await replica.actor.embed.remote(request)
                return result
            except RayActorError as exc:
                self.mark_dead(replica)
                if attempt == 0 and self.replicas:
                    continue
                raise _unwrap(exc, self.config.name) from None
            except RayTaskError as exc:
                raise _unwrap(exc, self.config.name) from None
            finally:
                replica.inflight -= 1
        raise ServiceUnavailableError(f"Model `{self.config.name}` has no ready replica.")
