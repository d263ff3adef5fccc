"""Routing one model's requests over its ready replicas, and carrying deltas back over Ray.

Least-loaded choice uses the gateway's own count of in-flight requests per replica: it is exact
for this process and costs no round trip. Closing a stream early (client disconnect) cancels the
Ray generator task, which closes the engine's stream inside the replica.

The replica list is replaced whenever the controller's routing table changes (`update`); requests
already running keep their `Replica` object, so scaling never disturbs them. A request that fails
before its first token because its replica is draining or has just died is retried on another
replica: nothing reached the client yet, so the retry is invisible to it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from backends.cluster.route_table import DeploymentRoute
from backends.cluster.replica import ReplicaDrainingError
from protocol.admin import DeploymentState
from protocol.config import ModelConfig
from protocol.errors import EngineError, OpenAIError, ServiceUnavailableError
from protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    TokenizeRequest,
    TokenizeResult,
)


@dataclass
class Replica:
    actor: Any
    id: str
    node_id: str = ""
    context_length: int = 0
    inflight: int = field(default=0)


def _unwrap(exc: Exception, model: str) -> OpenAIError:
    """Errors from a replica arrive wrapped by Ray; clients see the engine's own typed error."""
    if isinstance(exc, RayTaskError):
        cause = exc.cause
        if isinstance(cause, OpenAIError):
            return type(cause)(cause.message, param=cause.param, code=cause.code)
        if isinstance(cause, RayActorError | ReplicaDrainingError):
            return ServiceUnavailableError(f"No replica of `{model}` could take the request; please retry.")
        return EngineError(f"Model `{model}` failed: {cause}")
    if isinstance(exc, RayActorError):
        return ServiceUnavailableError(
            f"The replica serving `{model}` stopped while handling the request; please retry."
        )
    if isinstance(exc, OpenAIError):
        return exc
    return EngineError(f"Model `{model}` failed: {exc}")


def _retryable(exc: Exception) -> bool:
    """The replica refused (draining) or vanished: safe to retry if nothing was sent yet."""
    if isinstance(exc, RayTaskError):
        return isinstance(exc.cause, RayActorError | ReplicaDrainingError)
    return isinstance(exc, RayActorError)


class ModelRouter:
    def __init__(self, config: ModelConfig, replicas: list[Replica]) -> None:
        self.config = config
        self.replicas = replicas
        self.state: DeploymentState = "ready" if replicas else "loading"
        self.error: str | None = None
        self.restarts = 0
        self._tiebreak = itertools.count()

    def update(self, route: DeploymentRoute) -> None:
        """Take the controller's latest view, keeping the objects (and counts) of known replicas."""
        known = {r.id: r for r in self.replicas}
        replicas = []
        for r in route.replicas:
            replica = known.get(r.id) or Replica(actor=r.actor, id=r.id)
            replica.node_id, replica.context_length = r.node_id, r.context_length
            replicas.append(replica)
        self.config, self.state, self.error, self.replicas = route.spec, route.state, route.error, replicas
        self.restarts = route.restarts

    def _pick(self, tried: set[str]) -> Replica:
        replicas = [r for r in self.replicas if r.id not in tried]
        if not replicas:
            raise ServiceUnavailableError(f"Model `{self.config.name}` has no ready replica; please retry.")
        low = min(r.inflight for r in replicas)
        candidates = [r for r in replicas if r.inflight == low]
        return candidates[next(self._tiebreak) % len(candidates)]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        tried: set[str] = set()
        while True:
            replica = self._pick(tried)
            replica.inflight += 1
            stream = replica.actor.generate.options(num_returns="streaming").remote(request)
            started = finished = False
            try:
                async for ref in stream:
                    for delta in await ref:
                        started = True
                        if delta.finish_reason is not None:
                            # The last delta (engine contract): done now, without waiting another
                            # Ray round trip for the end of the stream (~1-2 ms per request).
                            finished = True
                            yield delta
                            return
                        yield delta
                finished = True
                return
            except (RayTaskError, RayActorError) as exc:
                finished = True
                if started or not _retryable(exc):
                    raise _unwrap(exc, self.config.name) from None
                tried.add(replica.id)
            finally:
                replica.inflight -= 1
                if not finished:
                    ray.cancel(stream)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        tried: set[str] = set()
        while True:
            replica = self._pick(tried)
            replica.inflight += 1
            try:
                result: EmbedResult = await replica.actor.embed.remote(request)
                return result
            except (RayTaskError, RayActorError) as exc:
                if not _retryable(exc):
                    raise _unwrap(exc, self.config.name) from None
                tried.add(replica.id)
            finally:
                replica.inflight -= 1

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        result: TokenizeResult = await self._call("tokenize", request)
        return result

    async def detokenize(self, tokens: list[int]) -> str:
        text: str = await self._call("detokenize", tokens)
        return text

    async def _call(self, method: str, *args: Any) -> Any:
        """One request/response call on the least-loaded replica, with the replica's typed error."""
        replica = self._pick(set())
        replica.inflight += 1
        try:
            return await getattr(replica.actor, method).remote(*args)
        except (RayTaskError, RayActorError) as exc:
            raise _unwrap(exc, self.config.name) from None
        finally:
            replica.inflight -= 1
