"""`CallRecorder`: what each engine call of a `ModelHandle` leaves behind when it ends.

The request's token usage (`UsageCount`, what the ledger is handed when the request ends), the
per-model metrics (queue time, TTFT, time per output token, end-to-end latency, token counts,
LoRA counters) and the end of the call's span with the request span's totals. Its own room
because these are observations of a call, whichever endpoint made it; the handle
(server/serving/handle.py) decides when a call starts, waits and ends, and tells it here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raygate.protocol.generation import Delta
from raygate.server.context import RequestContext
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.observability.tracing import RequestTrace, ended

if TYPE_CHECKING:
    from opentelemetry.trace import Span


@dataclass
class UsageCount:
    """A request's tokens so far, over all its engine calls (reasoning tokens are part of the
    completion tokens, counted apart too by a reasoning model's engine)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class CallRecorder:
    """One request's record of its engine calls to one model."""

    def __init__(
        self, ctx: RequestContext, metrics: GatewayMetrics, model: str, lora: tuple[tuple[str, float], ...]
    ) -> None:
        self._ctx = ctx
        self._metrics = metrics
        self._labels = {"model_name": model}
        self._lora = lora
        self.usage = UsageCount()

    def queued(self, seconds: float) -> None:
        """The admission wait of the request (observed once)."""
        self._metrics.queue_time.observe(self._labels, seconds)

    def first_token(self, first_at: float, span: Span | None) -> None:
        """A streamed call's first delta arrived at `first_at` (loop time)."""
        self._metrics.ttft.observe(self._labels, first_at - self._ctx.started)
        if span is not None:
            span.add_event("first_token")

    def trace_call(
        self, span: Span, last: Delta | None, first_at: float | None, failure: BaseException | None
    ) -> None:
        """End a streamed replica call's span (usage and finish reason of its last delta)."""
        attributes: dict[str, str | int | float] = {}
        if last is not None:
            attributes["gen_ai.usage.input_tokens"] = last.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = last.completion_tokens
            attributes["raygate.finish_reason"] = last.finish_reason or "cut_short"
        self.end_call(
            span, attributes, failure if last is None or last.finish_reason is None else None, first_at
        )

    def end_call(
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

    def record(self, last: Delta | None, first_at: float | None, end: float, counts_prompt: bool) -> None:
        """Usage and metrics of a streamed call, from its last delta (None: it yielded none)."""
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

    def record_whole(self, prompt_tokens: int) -> None:
        """Metrics of a call answered whole (no tokens generated): prompt tokens, success, e2e."""
        self.usage.calls += 1
        self.usage.prompt_tokens += prompt_tokens
        self._metrics.prompt_tokens.add(self._labels, prompt_tokens)
        self._metrics.success.inc({**self._labels, "finished_reason": "stop"})
        self._metrics.e2e.observe(self._labels, asyncio.get_running_loop().time() - self._ctx.started)
