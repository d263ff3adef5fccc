"""Routing one model's requests over its ready replicas, and carrying deltas back over Ray.

Least-loaded choice uses the gateway's own count of in-flight requests per replica: it is exact
for this process and costs no round trip. With `routing.policy: prefix_affinity` a generation goes
to the replica that last served the longest known prefix of its prompt (`affinity.py`) unless that
replica carries more than `max_imbalance` requests above the least-loaded one: a *hit*, a
*fallback* (too loaded: least-loaded instead), or a *miss* (no known prefix, or one that every
replica has served, such as a shared system prompt: each holds it, so least-loaded decides).

Batch lines (`GenerateRequest.background`) are load an interactive request does not see: an
engine hands a batch line's slot to an interactive sequence that needs it, so an interactive
request is placed by the interactive requests in flight (then by all, to preempt fewer lines),
and a batch line by all. Counted together, a replica that happened to hold more batch lines
drew fewer interactive requests, and the interactive loop of issue 48's bench row (4 clients, 2
replicas) ran 3 + 1 instead of 2 + 2 for stretches (13 of 122 requests in one run), each one
there decoding beside two others.

An autoscaled model may have no replica at all (scaled to zero, or its last one draining): a
request then waits for one to become ready (bounded by the caller's first-token deadline), and
`on_demand` tells the gateway's load reporter at once, so the controller starts one.

Closing a stream early (client disconnect) cancels the Ray generator task, which closes the
engine's stream inside the replica.

The replica list is replaced whenever the controller's routing table changes (`update`); requests
already running keep their `Replica` object, so scaling never disturbs them. A request that fails
before its first token because its replica is draining (it refused the request, nothing ran) is
retried on another replica: nothing reached the client yet, so the retry is invisible to it.

A replica that dies while holding a request is different (issue #12): the request may be what
killed it, and retrying it crashed every replica of the model in turn. That request fails once
(`ReplicaDiedError`), and the router sends nothing more to the dead replica until the
controller's next table drops it (`Replica.dead`).

Streams are opened with Ray's generator backpressure (`UNREAD_BATCHES`): the replica pauses once
that many of its batches wait here unread, so a client that reads nothing holds the engine back
instead of filling this process's memory with the whole answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from raygate.backends.cluster.routing import socket_stream
from raygate.backends.cluster.routing.affinity import AdapterHolders, PrefixTable, prefix_keys, prompt_text
from raygate.backends.cluster.routing.route_table import DeploymentRoute
from raygate.backends.cluster.runtime.errors import CALL_ERRORS, REPLICA_ERRORS, Mapped, remote_cause
from raygate.protocol.admin import DeploymentState, DownloadProgress, ScalingEvent
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import ModelLoadingError, ServiceUnavailableError
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
from raygate.protocol.sampling_defaults import SamplingDefaults

log = logging.getLogger(__name__)

# Batches (of up to `replica.MAX_DELTAS_PER_YIELD` deltas) a replica may yield ahead of this
# gateway's reading. A reading client never gets near it: the router awaits each batch at once.
UNREAD_BATCHES = 8
# Upper bound on waiting for a replica of a model at zero when the caller set no deadline.
MAX_REPLICA_WAIT_SECONDS = 300.0


@dataclass
class AffinityCounts:
    """Prefix-affinity outcomes since this gateway started (`raygate:routing_affinity_total`)."""

    hit: int = 0
    fallback: int = 0
    miss: int = 0


@dataclass
class Replica:
    """A replica as this gateway's router tracks it; `inflight` counts only the requests this process sent
    there, which is all least-loaded choice needs."""

    actor: Any
    id: str
    node_id: str = ""
    context_length: int = 0
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    inflight: int = field(default=0)
    background: int = 0  # of `inflight`: batch lines
    dead: bool = False  # a call saw the actor die: no new requests until the table drops it
    socket: str = ""  # the replica's socket for deltas (`socket_stream.py`); "": none


Load = Callable[[Replica], tuple[int, int]]


def _interactive_load(replica: Replica) -> tuple[int, int]:
    """An interactive request's view: the interactive requests in flight, then all."""
    return (replica.inflight - replica.background, replica.inflight)


def _total_load(replica: Replica) -> tuple[int, int]:
    """A batch line's view: every request in flight."""
    return (replica.inflight, replica.inflight)


@functools.cache
def _this_node() -> str:
    return str(ray.get_runtime_context().get_node_id())


async def _batches(replica: Replica, request: GenerateRequest) -> AsyncGenerator[list[Delta], None]:
    """The replica's delta batches: over its socket when it runs on this node (`socket_stream.py`),
    else over Ray. Closing this early cancels the request in the replica either way. A socket that
    cannot be reached from here (another container on the same node, say) is not tried again: the
    socket only saves time, and Ray reaches the replica wherever it is."""
    if replica.socket and replica.node_id == _this_node():
        try:
            over_socket = await socket_stream.open_stream(replica.socket, request, UNREAD_BATCHES)
        except OSError as exc:
            log.warning("replica %s: its socket is out of reach (%s); streaming over Ray", replica.id, exc)
            replica.socket = ""
        else:
            async with contextlib.aclosing(over_socket) as batches:
                async for batch in batches:
                    yield batch
            return
    stream = replica.actor.generate.options(
        num_returns="streaming", _generator_backpressure_num_objects=UNREAD_BATCHES
    ).remote(request)
    finished = False  # else cancelled on the way out: the reader left early
    try:
        async for ref in stream:
            deltas: list[Delta] = await ref
            finished = bool(deltas) and deltas[-1].finish_reason is not None
            yield deltas
        finished = True
    except CALL_ERRORS:
        finished = True
        raise
    finally:
        if not finished:
            ray.cancel(stream)


class ModelRouter:
    """Routes one model's requests to a ready replica by its `routing` policy, retrying on another when
    one fails before the first token (module docstring)."""

    def __init__(self, config: ModelConfig, replicas: list[Replica]) -> None:
        self.config = config
        self.replicas = replicas
        self.state: DeploymentState = "ready" if replicas else "loading"
        self.error: str | None = None
        self.restarts = 0
        self.desired = len(replicas)
        self.scaling_events: list[ScalingEvent] = []
        self.scaling_events_total = 0
        self.no_room: str | None = None
        self.download: DownloadProgress | None = None
        self.affinity = AffinityCounts()
        self.ongoing = 0  # requests inside this router now, waiting for a replica included
        self.waiting = 0  # of which waiting for a replica to become ready
        self.on_demand: Callable[[], None] = lambda: None
        self._prefixes = PrefixTable()
        self._holders: AdapterHolders | None = None  # with `lora.max_loras` only (`_adapter_choice`)
        self._tiebreak = itertools.count()
        self._changed = asyncio.Event()

    def update(self, route: DeploymentRoute) -> None:
        """Take the controller's latest view, keeping the objects (and counts) of known replicas."""
        known = {r.id: r for r in self.replicas}
        replicas = []
        for r in route.replicas:
            # A known replica keeps its socket as this router left it ("" once out of reach).
            replica = known.get(r.id) or Replica(actor=r.actor, id=r.id, socket=r.socket)
            replica.node_id, replica.context_length = r.node_id, r.context_length
            replica.generation_defaults = r.generation_defaults
            replicas.append(replica)
        self.config, self.state, self.error, self.replicas = route.spec, route.state, route.error, replicas
        self.restarts, self.desired, self.scaling_events = route.restarts, route.desired, route.scaling_events
        self.scaling_events_total = route.scaling_events_total
        self.no_room = route.no_room
        self.download = route.download
        if self._holders is not None:
            self._holders.forget({r.id for r in replicas})
        self._changed.set()  # wake requests waiting for a replica
        self._changed = asyncio.Event()

    def sampling_defaults(self) -> SamplingDefaults:
        """What a request is served with where it leaves a sampling field unset: the deployment's
        `defaults:` over what the model's generation config recommends (read by its replicas,
        which share one spec; none is ready yet: the deployment's own)."""
        recommended = self.replicas[0].generation_defaults if self.replicas else {}
        own = self.config.defaults
        return own.over(SamplingDefaults.model_validate(recommended)) if recommended else own

    def servable(self) -> bool:
        """Worth admitting a request: a replica is ready, or (autoscaled) one can be started for it."""
        if self.replicas:
            return True
        return self.config.autoscaling is not None and self.state != "failed"

    async def _wait_for_replica(self, tried: set[str]) -> None:
        """Block while an autoscaled model has no untried replica (scale from zero, or the last one
        drained); the caller's deadline bounds it, `MAX_REPLICA_WAIT_SECONDS` when it has none."""
        if self.config.autoscaling is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MAX_REPLICA_WAIT_SECONDS
        while not any(r.id not in tried and not r.dead for r in self.replicas) and self.state != "failed":
            left = deadline - loop.time()
            if self.no_room is not None and not self.replicas:
                raise ModelLoadingError(
                    f"Model `{self.config.name}` has no replica and none can start now: {self.no_room}.",
                    code="no_capacity",
                )
            if left <= 0:
                raise ServiceUnavailableError(
                    f"Model `{self.config.name}` got no ready replica within "
                    f"{MAX_REPLICA_WAIT_SECONDS:.0f} s; please retry."
                )
            self.waiting += 1
            self.on_demand()
            try:
                await asyncio.wait_for(asyncio.shield(self._changed.wait()), left)
            except TimeoutError:
                pass
            finally:
                self.waiting -= 1

    def _pick(
        self,
        tried: set[str],
        keys: list[bytes] | None = None,
        adapters: tuple[str, ...] = (),
        background: bool = False,
    ) -> Replica:
        replicas = [r for r in self.replicas if r.id not in tried and not r.dead]
        if not replicas:
            raise ServiceUnavailableError(f"Model `{self.config.name}` has no ready replica; please retry.")
        load = _total_load if background else _interactive_load
        low = min(load(r)[0] for r in replicas)
        picked = self._by_prefix(replicas, low, keys, load) or self._by_adapter(replicas, low, adapters, load)
        if picked is None:
            least = min(load(r) for r in replicas)
            candidates = [r for r in replicas if load(r) == least]
            picked = candidates[next(self._tiebreak) % len(candidates)]
        if keys:
            self._prefixes.record(keys, picked.id)
        if adapters and self._holders is not None:
            self._holders.record(adapters, picked.id)
        return picked

    def _by_prefix(
        self, replicas: list[Replica], low: int, keys: list[bytes] | None, load: Load
    ) -> Replica | None:
        """The replica that served the longest known prefix last, unless it is too loaded."""
        if keys:
            preferred = self._prefixes.preferred(keys, {r.id for r in replicas})
            chosen = next((r for r in replicas if r.id == preferred), None)
            if chosen is None:
                self.affinity.miss += 1
            elif load(chosen)[0] - low <= self.config.routing.max_imbalance:
                self.affinity.hit += 1
                return chosen
            else:
                self.affinity.fallback += 1
        return None

    def _by_adapter(
        self, replicas: list[Replica], low: int, adapters: tuple[str, ...], load: Load
    ) -> Replica | None:
        """With `lora.max_loras` (replicas hold only their latest adapters): the least loaded of
        the replicas this gateway last sent the request's adapters to, unless too loaded."""
        if not adapters or self._holders is None:
            return None
        ids = self._holders.holding(adapters, [r.id for r in replicas])
        near = [r for r in replicas if r.id in ids and load(r)[0] - low <= self.config.routing.max_imbalance]
        return min(near, key=load) if near else None

    def _adapters(self, request: GenerateRequest) -> tuple[str, ...]:
        """The adapters a request decodes under, when where they are loaded matters (a bound)."""
        bound = self.config.lora.max_loras
        if bound is None or not request.lora or len(self.replicas) <= 1:
            return ()
        if self._holders is None:
            self._holders = AdapterHolders(bound)
        return tuple(name for name, scale in request.lora if scale != 0.0)

    def _keys(self, request: GenerateRequest) -> list[bytes] | None:
        routing = self.config.routing
        if routing.policy != "prefix_affinity":
            return None
        if len(self.replicas) <= 1 and self.config.autoscaling is None:
            return None  # one fixed replica holds every prefix: nothing to choose or remember
        return prefix_keys(prompt_text(request), routing.block_chars, routing.max_blocks)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        self.ongoing += 1
        try:
            tried: set[str] = set()
            keys, adapters = self._keys(request), self._adapters(request)
            background = request.background
            while True:
                await self._wait_for_replica(tried)
                replica = self._pick(tried, keys, adapters, background)
                replica.inflight += 1
                replica.background += background
                started = False
                try:
                    async with contextlib.aclosing(_batches(replica, request)) as batches:
                        async for batch in batches:
                            for delta in batch:
                                started = True
                                yield delta
                                if delta.finish_reason is not None:
                                    # The last delta (engine contract): done now, without waiting
                                    # for the end of the stream (a Ray round trip: ~1-2 ms).
                                    return
                    return
                except CALL_ERRORS as exc:
                    mapped = self._mapped(exc, replica)
                    if started or not mapped.retry:
                        raise mapped.error from None
                    tried.add(replica.id)
                finally:
                    replica.inflight -= 1
                    replica.background -= background

        finally:
            self.ongoing -= 1

    def _mapped(self, exc: BaseException, replica: Replica) -> Mapped:
        """The typed error for a failed call; a death of the actor itself (not an error its code
        raised, which Ray makes an instance of the cause's type too) marks the replica dead."""
        if remote_cause(exc) is None:
            replica.dead = True
        mapped = REPLICA_ERRORS.map(exc, self.config.name)
        assert mapped is not None  # the table's last rows match anything
        return mapped

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        result: EmbedResult = await self._retried("embed", request)
        return result

    async def rank(self, request: RankRequest) -> RankResult:
        result: RankResult = await self._retried("rank", request)
        return result

    async def _retried(self, method: str, request: Any) -> Any:
        """A whole-answer call (embed, rank): a replica that refuses it (draining, or its actor gone
        before the call ran) is tried elsewhere, since nothing has reached the client yet. One that
        dies while holding the request is not: the request may be what killed it (a 503
        `replica_died`, REPLICA_ERRORS)."""
        tried: set[str] = set()
        self.ongoing += 1
        try:
            while True:
                await self._wait_for_replica(tried)
                replica = self._pick(tried)
                replica.inflight += 1
                try:
                    return await getattr(replica.actor, method).remote(request)
                except (RayTaskError, RayActorError) as exc:
                    mapped = self._mapped(exc, replica)
                    if not mapped.retry:
                        raise mapped.error from None
                    tried.add(replica.id)
                finally:
                    replica.inflight -= 1
        finally:
            self.ongoing -= 1

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        result: TokenizeResult = await self._call("tokenize", request)
        return result

    async def detokenize(self, tokens: list[int]) -> str:
        text: str = await self._call("detokenize", tokens)
        return text

    async def _call(self, method: str, *args: Any) -> Any:
        """One request/response call on the least-loaded replica, with the replica's typed error."""
        self.ongoing += 1
        try:
            await self._wait_for_replica(set())
            replica = self._pick(set())
            replica.inflight += 1
            try:
                with REPLICA_ERRORS.raising(self.config.name):
                    return await getattr(replica.actor, method).remote(*args)
            finally:
                replica.inflight -= 1
        finally:
            self.ongoing -= 1
