"""`ModelWorker`: the Ray actor that hosts one engine replica.

Deltas leave through a Ray streaming generator. Each `yield` costs a Ray object (measured: one
delta per yield caps near 1k items/s, 16 per yield near 10k), so the worker coalesces: the first
delta goes out at once, later ones are batched with whatever else arrived while the previous
batch was being handed to Ray. No timer is involved, so coalescing never adds latency.

Each item also wakes threads in this process, the gateway and the client, and on a machine whose
cores all run the engine's threads every wake-up stalls a decode step (llama.cpp's threads meet at
a barrier per operation). A model's `stream_interval_ms` therefore spaces the batches out: tokens
made within it travel as one item; the first and the last delta are never held, so neither TTFT
nor the end of a request moves (docs/performance.md has the measurements). The interval is per
stream and does not grow with the streams: a replica serving n streams once spaced each one's
items n intervals apart (up to 250 ms), which measured within the noise on throughput and put a
client's inter-token gap p99 at ~250 ms at c=8 against llama-server's 66-81 ms (issue #52).

Backpressure: the engine's deltas wait in a bounded pump (`MAX_QUEUED_DELTAS`), and the router
opens the stream with Ray's generator backpressure, so a gateway that stops pulling (its client
reads nothing) stops this worker's yields, then the pump's producer, then the engine.

The worker also counts its own in-flight requests (from every gateway), so the controller can drain
it before stopping it: `drain()` turns new requests away with `ReplicaDrainingError`, which the
router retries on another replica, and waits for the running ones to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import ray

from raygate.backends.cluster.routing.socket_stream import SocketServer
from raygate.backends.cluster.runtime.errors import ReplicaDrainingError
from raygate.backends.engines.base import Engine, EngineStats
from raygate.backends.engines.factory import make_engine
from raygate.backends.engines.model_files import ModelFileError, generation_defaults, resolve_adapter
from raygate.backends.engines.model_hub import (
    combined_progress,
    fetch_adapter,
    fetch_adapters,
    fetch_hub_files,
    hub_downloads,
)
from raygate.backends.heap import freeze_startup_heap
from raygate.backends.streams import Pump
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    RankRequest,
    RankResult,
    TokenizeRequest,
    TokenizeResult,
)
from raygate.protocol.model_source import ModelSource

MAX_DELTAS_PER_YIELD = 64
# Deltas the engine may run ahead of Ray's yields; one full batch, so coalescing is unchanged.
MAX_QUEUED_DELTAS = MAX_DELTAS_PER_YIELD
DRAIN_POLL_SECONDS = 0.05

__all__ = ["MAX_DELTAS_PER_YIELD", "ModelWorker", "ReplicaDrainingError"]

# A call answered whole, and its answer.
W = TypeVar("W", EmbedRequest, RankRequest)
R = TypeVar("R", EmbedResult, RankResult)


def _is_last(delta: Delta) -> bool:
    return delta.finish_reason is not None


class ModelWorker:
    """The replica actor of the module docstring: loads one engine, streams its deltas in coalesced batches,
    and counts in-flight requests so it can be drained."""

    def __init__(self, config: ModelConfig) -> None:
        self._config = config
        self._engine: Engine | None = None
        self._inflight = 0
        self._draining = False
        self._socket = SocketServer(self.generate)
        self._downloads = hub_downloads(config)

    async def start(self) -> dict[str, Any]:
        """Load the model; called once by the controller, which treats an exception as `failed`.
        A Hub source is fetched onto this node first (backends/engines/model_hub.py); the engine
        then loads the local copy."""
        if self._downloads:
            self._config = await asyncio.to_thread(fetch_hub_files, self._config, self._downloads)
        self._config = await asyncio.to_thread(fetch_adapters, self._config)  # those from a Hub
        recommended = generation_defaults(self._config)  # before the load: a bad file fails fast
        engine = make_engine(self._config)
        await engine.start()
        for adapter in self._config.adapters:  # a bad one fails the replica, naming it
            path = resolve_adapter(adapter.source, self._config.backend)
            await engine.load_adapter(adapter.name, str(path))
        self._engine = engine
        # The engine's heap (torch, vLLM: ~700k objects) lives as long as this actor; frozen, the
        # collector stops walking it mid-stream (backends/heap.py: pauses of ~1 s on busy cores).
        freeze_startup_heap()
        socket = await self._socket.start() if self._config.task == "generate" else None
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "context_length": engine.context_length,
            "generation_defaults": recommended,
            "socket": socket or "",
            "download": await self.progress(),  # the last word: a load may end between two polls
        }

    async def progress(self) -> dict[str, Any] | None:
        """The Hub download's progress (None for local weights, or before the files are known)."""
        if not self._downloads:
            return None
        reading = await asyncio.to_thread(combined_progress, self._downloads)
        return reading.model_dump() if reading is not None else None

    def _require(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("replica not started")
        return self._engine

    def _admit(self) -> Engine:
        if self._draining:
            raise ReplicaDrainingError(f"replica of `{self._config.name}` is draining")
        return self._require()

    async def watch(self) -> None:
        """Never returns. The controller keeps this call open: Ray fails it as soon as the actor or
        its node dies, which is how a death is noticed without polling."""
        await asyncio.Event().wait()

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests from now on and wait up to `timeout` s for the running ones.
        Returns whether every in-flight request finished."""
        self._draining = True
        deadline = time.monotonic() + timeout
        # A request that reached this actor just before the drain may not have started (and been
        # counted) yet: give it one poll interval to, so the loop below does not miss it.
        await asyncio.sleep(DRAIN_POLL_SECONDS)
        # A poll, not an event: a drain is rare; no event to signal on every request end.
        while self._inflight and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        self._socket.close()  # its folder goes now: a stopped actor has no say
        return self._inflight == 0

    async def inflight(self) -> int:
        return self._inflight

    async def load_adapter(self, name: str, source: ModelSource) -> None:
        """A LoRA adapter added at run time (`POST /v1/load_lora_adapter`), read on this node
        (fetched onto it first when it comes from a Hub)."""
        try:
            if source.hub is not None:
                source = await asyncio.to_thread(fetch_adapter, source, self._config.backend)
            path = resolve_adapter(source, self._config.backend)
        except ModelFileError as exc:
            raise BadRequestError(f"LoRA adapter `{name}`: {exc}", param="lora_path") from None
        await self._require().load_adapter(name, str(path))

    async def unload_adapter(self, name: str) -> None:
        await self._require().unload_adapter(name)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[list[Delta], None]:
        engine = self._admit()
        self._inflight += 1
        try:
            batches = self._batches(engine, request)
            if request.trace is not None:  # only then: tracing off loads no OpenTelemetry
                from raygate.backends.cluster.routing.replica_trace import traced_batches

                batches = traced_batches(request.trace, self._span_attributes(request.request_id), batches)
            async with contextlib.aclosing(batches) as stream:
                async for batch in stream:
                    yield batch
        finally:
            self._inflight -= 1

    def _span_attributes(self, request_id: str) -> dict[str, str | int]:
        """What the replica's span of a traced call says about where it ran."""
        runtime = ray.get_runtime_context()
        return {
            "gen_ai.request.model": self._config.name,
            "raygate.engine_request_id": request_id,
            "raygate.replica": runtime.get_actor_name() or "",
            "raygate.node_id": runtime.get_node_id(),
            "raygate.inflight": self._inflight,
        }

    async def _batches(self, engine: Engine, request: GenerateRequest) -> AsyncGenerator[list[Delta], None]:
        """The engine's deltas, coalesced: the first at once, then whatever queued meanwhile.
        Cancellation (client gone -> ray.cancel) closes the pump, which closes the engine stream."""
        interval = self._config.stream_interval_ms / 1000
        async with Pump[Delta](MAX_QUEUED_DELTAS) as pump:
            pump.add(engine.generate(request))
            async for batch in pump.batches(MAX_DELTAS_PER_YIELD, interval, _is_last):
                yield batch

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        return await self._whole("embed", request, self._admit().embed)

    async def rank(self, request: RankRequest) -> RankResult:
        return await self._whole("rank", request, self._admit().rank)

    async def _whole(self, operation: str, request: W, call: Callable[[W], Awaitable[R]]) -> R:
        """A call answered whole (embed, rank), counted in flight, with its spans when traced."""
        self._inflight += 1
        try:
            if request.trace is None:
                return await call(request)
            from raygate.backends.cluster.routing.replica_trace import traced_call

            attributes = self._span_attributes(request.request_id)
            return await traced_call(request.trace, operation, attributes, call(request))
        finally:
            self._inflight -= 1

    async def abort(self, request_id: str) -> bool:
        return await self._require().abort(request_id)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return await self._require().tokenize(request)

    async def detokenize(self, tokens: list[int]) -> str:
        return await self._require().detokenize(tokens)

    async def count_tokens(self, text: str) -> int:
        return await self._require().count_tokens(text)

    async def check_health(self) -> None:
        await self._require().check_health()

    async def stats(self) -> EngineStats:
        return self._require().stats()
