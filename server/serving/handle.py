"""`ModelHandle`: what the serving layer calls instead of the model's router.

It adds what every engine call needs and no endpoint should repeat: the admission wait, the engine
request id prefixed with the HTTP request id, the time-to-first-token and total deadlines (on
expiry the engine stream is cancelled, which aborts the engine request), the drain stop, and the
per-model metrics (TTFT, time per output token, end-to-end latency, queue time, token counts),
and the request's token usage for the ledger. The router is private: every engine call,
`/tokenize` included, goes through a method here.

Usage is counted here because every endpoint's engine calls pass through (chat, completions,
Responses, Messages, embeddings, rerank and score, and Ollama's faces of them; tokenizing and
Anthropic's count_tokens run no inference and record nothing): the same counts the endpoint
renders as its `usage` (prompt tokens once per prompt however many samples, `counts_prompt`;
cached and reasoning tokens), recorded once per request when it has ended (`record_usage`, on the
request context's close: off the request's latency). For the same reason every engine call takes
one path out of the gateway (`_enter`): the admission wait, the budget's reservation, the span.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request

from raygate.backends.cluster.routing.router import ModelRouter
from raygate.backends.cluster.stores.ledger_records import UsageRecord
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import GatewayTimeoutError, OpenAIError, RateLimitError
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
from raygate.server.context import RequestContext, request_context
from raygate.server.observability.ledger_writer import LedgerWriter
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.observability.tracing import RequestTrace, ended
from raygate.server.observability.usage_metrics import KeyLabels, count_usage
from raygate.server.serving.admission import Admission, Ticket, engine_slots
from raygate.server.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# Budget tokens one sequence reserves when no replica has told its context length yet.
FALLBACK_RESERVE = 32768

# The key id of requests to a gateway without keys.
ANONYMOUS = "anonymous"

# An engine call answered whole, and its answer.
W = TypeVar("W", EmbedRequest, RankRequest)
R = TypeVar("R", EmbedResult, RankResult)


@dataclass
class UsageCount:
    """A request's tokens so far, over all its engine calls (reasoning tokens are part of the
    completion tokens, counted apart too by a reasoning model's engine)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


def _earliest(*deadlines: float | None) -> float | None:
    present = [d for d in deadlines if d is not None]
    return min(present) if present else None


class ModelHandle:
    """One request's access to one admitted model; created by `open_model`."""

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
        self._metrics = metrics
        self._labels = {"model_name": router.config.name}
        self._span_attributes = {"gen_ai.request.model": router.config.name}
        limits = router.config.limits
        ttft = limits.ttft_timeout_s or settings.ttft_timeout_s
        total = limits.request_timeout_s or settings.request_timeout_s
        self._ttft_s, self._total_s = ttft, total
        self._ttft_deadline = None if ttft is None else ctx.started + ttft
        self._total_deadline = None if total is None else ctx.started + total
        self._queued_observed = False
        self.usage = UsageCount()
        self.queued_s = 0.0  # the admission wait, once admitted (Ollama reports it as load time)
        self._budgets = budgets
        self.reserved = 0  # budget tokens this request holds (server/access/budgets.py)

    @property
    def context_length(self) -> int | None:
        """The context of the model's ready replicas (the engine's own), None when none is ready."""
        lengths = [r.context_length for r in self._router.replicas if r.context_length > 0]
        return max(lengths) if lengths else None

    def sampling_defaults(self) -> SamplingDefaults:
        """The model's defaults: its `defaults:` over its generation config (ModelRouter)."""
        return self._router.sampling_defaults()

    def _ttft_expired(self) -> OpenAIError:
        return GatewayTimeoutError(
            f"Model `{self.config.name}` produced no token within {self._ttft_s:g} s.", code="ttft_timeout"
        )

    def _total_expired(self) -> OpenAIError:
        return GatewayTimeoutError(
            f"Model `{self.config.name}` did not finish within {self._total_s:g} s.", code="request_timeout"
        )

    async def _admitted(self) -> None:
        """Wait for a running slot (no-op when one was free), under the first-token deadline.

        A batch line waits for its slot as long as interactive traffic keeps it out (that is the
        point of its class), so its deadlines count from the slot, not from its arrival."""
        if self._ctx.batch and not self._queued_observed:
            queued = await self._ctx.bounded(self._ticket.wait(), None, self._total_expired)
            now = asyncio.get_running_loop().time()
            if self._ttft_s is not None:
                self._ttft_deadline = now + self._ttft_s
            if self._total_s is not None:
                self._total_deadline = now + self._total_s
            self._queued_observed = True
            self._metrics.queue_time.observe(self._labels, queued)
            return
        deadline = _earliest(self._ttft_deadline, self._total_deadline)
        expired = self._ttft_expired if deadline == self._ttft_deadline else self._total_expired
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
            self._metrics.queue_time.observe(self._labels, queued)

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
        first_at: float | None = None
        last: Delta | None = None
        failure: BaseException | None = None
        try:
            while True:
                if first_at is None:
                    deadline = _earliest(self._ttft_deadline, self._total_deadline)
                    expired = self._ttft_expired if deadline == self._ttft_deadline else self._total_expired
                else:
                    deadline, expired = self._total_deadline, self._total_expired
                try:
                    delta = await self._ctx.bounded(anext(stream), deadline, expired)
                except StopAsyncIteration:
                    break
                if first_at is None:
                    first_at = loop.time()
                    self._metrics.ttft.observe(self._labels, first_at - self._ctx.started)
                    if span is not None:
                        span.add_event("first_token")
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
            self._record(last, first_at, loop.time(), counts_prompt)
            if span is not None:
                self._trace_call(span, last, first_at, failure)

    def _trace_call(
        self, span: Span, last: Delta | None, first_at: float | None, failure: BaseException | None
    ) -> None:
        """End a streamed replica call's span (usage and finish reason of its last delta)."""
        attributes: dict[str, str | int | float] = {}
        if last is not None:
            attributes["gen_ai.usage.input_tokens"] = last.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = last.completion_tokens
            attributes["raygate.finish_reason"] = last.finish_reason or "cut_short"
        self._end_call(
            span, attributes, failure if last is None or last.finish_reason is None else None, first_at
        )

    def _end_call(
        self,
        span: Span,
        attributes: dict[str, str | int | float],
        failure: BaseException | None,
        first_at: float | None = None,
    ) -> None:
        """End a replica call's span, and bring the request's span up to date: its usage so far
        and its time to first token."""
        ended(span, attributes, failure)
        trace: RequestTrace | None = self._ctx.trace
        if trace is None:
            return
        totals: dict[str, str | int | float] = {
            "gen_ai.usage.input_tokens": self.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": self.usage.completion_tokens,
        }
        if self.usage.cached_tokens:
            totals["raygate.cached_tokens"] = self.usage.cached_tokens
        if self.usage.reasoning_tokens:
            totals["raygate.reasoning_tokens"] = self.usage.reasoning_tokens
        if first_at is not None and trace.first_token_s is None:
            trace.first_token_s = first_at - self._ctx.started
            totals["raygate.time_to_first_token_s"] = round(trace.first_token_s, 6)
        trace.span.set_attributes(totals)

    def _record(self, last: Delta | None, first_at: float | None, end: float, counts_prompt: bool) -> None:
        if last is None:
            return
        self.usage.calls += 1
        self.usage.completion_tokens += last.completion_tokens
        self.usage.reasoning_tokens += last.reasoning_tokens or 0
        if counts_prompt:
            self.usage.prompt_tokens += last.prompt_tokens
            self.usage.cached_tokens += last.cached_tokens or 0
        self._metrics.prompt_tokens.add(self._labels, last.prompt_tokens)
        self._metrics.generation_tokens.add(self._labels, last.completion_tokens)
        for name, _ in self._lora:
            lora = {**self._labels, "lora_name": name}
            self._metrics.lora_generation_tokens.add(lora, last.completion_tokens)
            if last.finish_reason is not None:
                self._metrics.lora_sequences.inc(lora)
        if last.finish_reason is None:
            return  # cut short (client gone, timeout, failure): no latency sample
        self._metrics.success.inc({**self._labels, "finished_reason": last.finish_reason})
        self._metrics.e2e.observe(self._labels, end - self._ctx.started)
        if first_at is not None and last.completion_tokens > 1:
            self._metrics.tpot.observe(self._labels, (end - first_at) / (last.completion_tokens - 1))

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
            result = await self._ctx.bounded(call(request), self._total_deadline, self._total_expired)
        except BaseException as exc:
            if span is not None:
                self._end_call(span, {}, exc)
            raise
        finally:
            self._ticket.call_ended()
        self._record_whole(result.prompt_tokens)
        if span is not None:
            self._end_call(span, {"gen_ai.usage.input_tokens": result.prompt_tokens}, None)
        return result

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embeddings; the budget holds the context per input."""
        return await self._whole(request, len(request.inputs), self._router.embed)

    async def rank(self, request: RankRequest) -> RankResult:
        """A cross-encoder's logits; the budget holds the context per pair."""
        return await self._whole(request, len(request.pairs), self._router.rank)

    def _record_whole(self, prompt_tokens: int) -> None:
        """Metrics of a call answered whole (no tokens generated): prompt tokens, success, e2e."""
        self.usage.calls += 1
        self.usage.prompt_tokens += prompt_tokens
        self._metrics.prompt_tokens.add(self._labels, prompt_tokens)
        self._metrics.success.inc({**self._labels, "finished_reason": "stop"})
        self._metrics.e2e.observe(self._labels, asyncio.get_running_loop().time() - self._ctx.started)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        """The model's tokenizer, after the admission wait and within the request deadline.

        No metrics: tokenizing is not inference, and it has no request id (it cannot be aborted,
        only abandoned: the replica finishes it and nobody reads the answer).
        """
        await self._admitted()
        return await self._ctx.bounded(
            self._router.tokenize(request), self._total_deadline, self._total_expired
        )

    async def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens`, under the same admission and deadline as `tokenize`."""
        await self._admitted()
        return await self._ctx.bounded(
            self._router.detokenize(tokens), self._total_deadline, self._total_expired
        )


def record_usage(request: Request, handle: ModelHandle, endpoint: str) -> None:
    """Hand the request's usage to the ledger writer and the per-key metrics (a request that
    reached no engine has none)."""
    usage = handle.usage
    state = request.app.state
    ctx = request_context(request)
    if not usage.calls:
        if handle.reserved and ctx.key is not None:
            state.budgets.unreserve(ctx.key.id, handle.reserved)
        return
    record = UsageRecord(
        at=time.time(),
        key_id=ctx.key.id if ctx.key is not None else ANONYMOUS,
        model=handle.config.name,
        endpoint=endpoint,
        request_id=ctx.request_id,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        reserved=handle.reserved,
    )
    labels: KeyLabels = state.key_labels
    count_usage(state.metrics, labels, record)
    writer: LedgerWriter | None = getattr(state, "ledger_writer", None)
    if writer is not None:
        writer.usage(record, urgent=ctx.key is not None and ctx.key.budget is not None)


def open_model(
    request: Request, router: ModelRouter, endpoint: str = "", lora: tuple[tuple[str, float], ...] = ()
) -> ModelHandle:
    """Admit the request to `router`'s model (or refuse it with 429) and wrap the router; its
    usage is recorded under `endpoint` when the request ends. `lora`: the LoRA adapters (name,
    scale) every sequence decodes under (`lora_choice.py`)."""
    state = request.app.state
    ctx = request_context(request)
    ctx.model = router.config.name
    admission: Admission = state.admission
    metrics: GatewayMetrics = state.metrics
    gate = admission.gate(router.config.name, router.config.limits)
    per_replica = engine_slots(router.config)
    gate.slots = None if per_replica is None else per_replica * max(1, len(router.replicas))
    priority = ctx.priority
    if priority is None:
        priority = ctx.key.priority if ctx.key is not None and ctx.key.priority is not None else 0
    try:
        ticket = gate.enter(priority, batch=ctx.batch)
    except RateLimitError:
        metrics.rejected.inc({"model_name": router.config.name, "reason": "queue_full"})
        raise
    ctx.on_close(ticket.release)
    handle = ModelHandle(router, ctx, ticket, metrics, state.settings, lora, getattr(state, "budgets", None))
    ctx.on_close(lambda: record_usage(request, handle, endpoint))
    return handle
