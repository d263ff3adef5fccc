"""`ModelHandle`: what the serving layer calls instead of the model's router.

It adds what every engine call needs and no endpoint should repeat: the admission wait, the engine
request id prefixed with the HTTP request id, the time-to-first-token and total deadlines (on
expiry the engine stream is cancelled, which aborts the engine request), the drain stop, and the
per-model metrics (TTFT, time per output token, end-to-end latency, queue time, token counts),
and the request's token usage for the ledger. The router is private: every engine call,
`/tokenize` included, goes through a method here. The deadlines are `deadlines.Deadlines`; what a
call leaves behind (usage, metrics, its span's end) is recorded by `call_recorder.CallRecorder`.

Usage is counted here because every endpoint's engine calls pass through (chat, completions,
Responses, Messages, embeddings, rerank and score, and Ollama's faces of them; tokenizing and
Anthropic's count_tokens run no inference and record nothing): the same counts the endpoint
renders as its `usage` (prompt tokens once per prompt however many samples, `counts_prompt`;
cached and reasoning tokens), recorded once per request when it has ended
(`request_usage.record_usage`, on the request context's close: off the request's latency). For
the same reason every engine call takes one path out of the gateway (`_enter`): the admission
wait, the budget's reservation, the span.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from raygate.backends.cluster.routing.router import ModelRouter
from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    RankRequest,
    RankResult,
    TokenizeRequest,
    TokenizeResult,
    TraceCarrier,
)
from raygate.protocol.sampling_defaults import SamplingDefaults
from raygate.server.access.budgets import Budgets
from raygate.server.context import RequestContext
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.observability.tracing import RequestTrace, ended
from raygate.server.serving.admission import Ticket
from raygate.server.serving.call_recorder import CallRecorder, UsageCount
from raygate.server.serving.deadlines import Deadlines
from raygate.server.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# Budget tokens one sequence reserves when no replica has told its context length yet.
FALLBACK_RESERVE = 32768

# An engine call answered whole, and its answer.
W = TypeVar("W", EmbedRequest, RankRequest)
R = TypeVar("R", EmbedResult, RankResult)


class ModelHandle:
    """One request's access to one admitted model; created by `open_model` (resolve.py)."""

    def __init__(
        self,
        router: ModelRouter,
        ctx: RequestContext,
        ticket: Ticket,
        metrics: GatewayMetrics,
        settings: Settings,
        lora: tuple[tuple[str, float], ...] = (),
        budgets: Budgets | None = None,
    ) -> None:
        self._router = router
        self._lora = lora
        self.config: ModelConfig = router.config
        self._ctx = ctx
        self._ticket = ticket
        self._span_attributes = {"gen_ai.request.model": router.config.name}
        self._deadlines = Deadlines(router.config, settings, ctx.started)
        self._queued_observed = False
        self._recorder = CallRecorder(ctx, metrics, router.config.name, lora)
        self.queued_s = 0.0  # the admission wait, once admitted (Ollama reports it as load time)
        self._budgets = budgets
        self.reserved = 0  # budget tokens this request holds (server/access/budgets.py)

    @property
    def usage(self) -> UsageCount:
        """The request's tokens so far, over all its engine calls."""
        return self._recorder.usage

    @property
    def context_length(self) -> int | None:
        """The context of the model's ready replicas (the engine's own), None when none is ready."""
        lengths = [r.context_length for r in self._router.replicas if r.context_length > 0]
        return max(lengths) if lengths else None

    def sampling_defaults(self) -> SamplingDefaults:
        """The model's defaults: its `defaults:` over its generation config (ModelRouter)."""
        return self._router.sampling_defaults()

    async def _admitted(self) -> None:
        """Wait for a running slot (no-op when one was free), under the first-token deadline.

        A batch line waits for its slot as long as interactive traffic keeps it out (that is the
        point of its class), so its deadlines count from the slot, not from its arrival."""
        if self._ctx.batch and not self._queued_observed:
            queued = await self._ctx.bounded(self._ticket.wait(), None, self._deadlines.total_expired)
            self._deadlines.restart(asyncio.get_running_loop().time())
            self._queued_observed = True
            self._recorder.queued(queued)
            return
        deadline, expired = self._deadlines.first_token()
        trace: RequestTrace | None = self._ctx.trace if not self._queued_observed else None
        span = trace.child("admission", attributes=self._span_attributes) if trace else None
        try:
            queued = await self._ctx.bounded(self._ticket.wait(), deadline, expired)
        except BaseException as exc:
            if span is not None:
                ended(span, {}, exc)
            raise
        if span is not None:
            ended(span, {"raygate.queued_s": queued})
        if not self._queued_observed:
            self._queued_observed = True
            self.queued_s = queued
            self._recorder.queued(queued)

    def _engine_id(self, request_id: str) -> str:
        return f"{self._ctx.request_id}/{request_id}"

    async def generate(self, request: GenerateRequest, *, counts_prompt: bool = True) -> AsyncIterator[Delta]:
        """The engine's deltas. `counts_prompt` False: another sequence of this request shares the
        prompt (a further sample of it), whose tokens usage counts once."""
        span = await self._enter()
        request = dataclasses.replace(
            request,
            request_id=self._engine_id(request.request_id),
            lora=self._lora,
            trace=self._carrier(span),
            priority=self._ticket.priority,
            background=self._ctx.batch,
        )
        loop = asyncio.get_running_loop()
        stream = self._router.generate(request)
        self._ticket.call_started()
        deadlines, recorder = self._deadlines, self._recorder
        first_at: float | None = None
        last: Delta | None = None
        failure: BaseException | None = None
        try:
            while True:
                if first_at is None:
                    deadline, expired = deadlines.first_token()
                else:
                    deadline, expired = deadlines.total, deadlines.total_expired
                try:
                    delta = await self._ctx.bounded(anext(stream), deadline, expired)
                except StopAsyncIteration:
                    break
                if first_at is None:
                    first_at = loop.time()
                    recorder.first_token(first_at, span)
                last = delta
                yield delta
        except BaseException as exc:
            failure = exc
            raise
        finally:
            close = getattr(stream, "aclose", None)  # an async generator: close it if we left early
            if close is not None:
                await close()
            self._ticket.call_ended()
            recorder.record(last, first_at, loop.time(), counts_prompt)
            if span is not None:
                recorder.trace_call(span, last, first_at, failure)

    async def _enter(self, sequences: int = 1) -> Span | None:
        """What every engine call does before it leaves the gateway, whatever its endpoint: wait
        for a running slot, hold the most it can use against the key's token budget (429 when
        spent), and open its `replica.call` span (None: tracing off)."""
        await self._admitted()
        await self._reserve(sequences)
        trace: RequestTrace | None = self._ctx.trace
        if trace is None:
            return None
        return trace.child("replica.call", client=True, attributes=self._span_attributes)

    def _carrier(self, span: Span | None) -> TraceCarrier | None:
        """The call's span context for the replica (None: tracing off)."""
        trace: RequestTrace | None = self._ctx.trace
        return trace.carrier(span) if trace is not None and span is not None else None

    async def _reserve(self, sequences: int) -> None:
        """Hold the most this engine call can use (the context per sequence, or per input of an
        embedding or rank call) against the key's token budget, if it has one."""
        key = self._ctx.key
        if self._budgets is None or key is None or key.budget is None or not key.budget.limits_tokens:
            return
        tokens = (self.context_length or FALLBACK_RESERVE) * sequences
        self.reserved += await self._budgets.reserve(self._ctx, tokens)

    async def _whole(self, request: W, sequences: int, call: Callable[[W], Awaitable[R]]) -> R:
        """An engine call answered whole (embed, rank): the steps of `_enter`, the request
        deadline, the usage and the span's end, the same for both."""
        span = await self._enter(sequences)
        request = dataclasses.replace(
            request, request_id=self._engine_id(request.request_id), trace=self._carrier(span)
        )
        self._ticket.call_started()
        try:
            result = await self._ctx.bounded(
                call(request), self._deadlines.total, self._deadlines.total_expired
            )
        except BaseException as exc:
            if span is not None:
                self._recorder.end_call(span, {}, exc)
            raise
        finally:
            self._ticket.call_ended()
        self._recorder.record_whole(result.prompt_tokens)
        if span is not None:
            self._recorder.end_call(span, {"gen_ai.usage.input_tokens": result.prompt_tokens}, None)
        return result

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embeddings; the budget holds the context per input."""
        return await self._whole(request, len(request.inputs), self._router.embed)

    async def rank(self, request: RankRequest) -> RankResult:
        """A cross-encoder's logits; the budget holds the context per pair."""
        return await self._whole(request, len(request.pairs), self._router.rank)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        """The model's tokenizer, after the admission wait and within the request deadline.

        No metrics: tokenizing is not inference, and it has no request id (it cannot be aborted,
        only abandoned: the replica finishes it and nobody reads the answer).
        """
        await self._admitted()
        return await self._ctx.bounded(
            self._router.tokenize(request), self._deadlines.total, self._deadlines.total_expired
        )

    async def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens`, under the same admission and deadline as `tokenize`."""
        await self._admitted()
        return await self._ctx.bounded(
            self._router.detokenize(tokens), self._deadlines.total, self._deadlines.total_expired
        )
