"""Routing one model's requests over its replica actors, and carrying deltas back over Ray.

Least-loaded choice uses the gateway's own count of in-flight requests per replica: it is exact
for this process and costs no round trip. Closing a stream early (client disconnect) cancels the
Ray generator task, which closes the engine's stream inside the replica.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from protocol.config import ModelConfig
from protocol.errors import EngineError, OpenAIError, ServiceUnavailableError
from protocol.generation import Delta, EmbedRequest, EmbedResult, GenerateRequest


@dataclass
class Replica:
    actor: Any
    index: int
    node_id: str = ""
    context_length: int = 0
    inflight: int = field(default=0)


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
    def __init__(self, config: ModelConfig, replicas: list[Replica]) -> None:
        self.config = config
        self.replicas = replicas
        self._tiebreak = itertools.count()

    def _pick(self) -> Replica:
        if not self.replicas:
            raise ServiceUnavailableError(f"Model `{self.config.name}` has no ready replica.")
        low = min(r.inflight for r in self.replicas)
        candidates = [r for r in self.replicas if r.inflight == low]
        return candidates[next(self._tiebreak) % len(candidates)]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        replica = self._pick()
        replica.inflight += 1
        stream = replica.actor.generate.options(num_returns="streaming").remote(request)
        finished = False
        try:
            async for ref in stream:
                for delta in await ref:
                    if delta.finish_reason is not None:
                        # The last delta (engine contract): done now, without waiting another
                        # Ray round trip for the end of the stream (~1-2 ms per request).
                        finished = True
                        yield delta
                        return
                    yield delta
            finished = True
        except (RayTaskError, RayActorError) as exc:
            finished = True
            raise _unwrap(exc, self.config.name) from None
        finally:
            replica.inflight -= 1
            if not finished:
                ray.cancel(stream)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        replica = self._pick()
        replica.inflight += 1
        try:
            result: EmbedResult = await replica.actor.embed.remote(request)
            return result
        except (RayTaskError, RayActorError) as exc:
            raise _unwrap(exc, self.config.name) from None
        finally:
            replica.inflight -= 1
