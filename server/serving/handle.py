"""`ModelHandle`: what the serving layer calls instead of the model's router.

It adds what every engine call needs and no endpoint should repeat: the admission wait, the engine
request id prefixed with the HTTP request id, the time-to-first-token and total deadlines (on
expiry the engine stream is cancelled, which aborts the engine request), the drain stop, and the
per-model metrics (TTFT, time per output token, end-to-end latency, queue time, token counts).
The router is private: every engine call, `/tokenize` included, goes through a method here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from fastapi import Request

from raygate.backends.cluster.routing.router import ModelRouter
from raygate.protocol.config import AdapterConfig, ModelConfig
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
)
from raygate.protocol.sampling_defaults import SamplingDefaults
from raygate.server.context import RequestContext, request_context
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.serving.admission import Admission, Ticket
from raygate.server.settings import Settings


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
        adapter: AdapterConfig | None = None,
    ) -> None:
        self._router = router
        self._lora = ((adapter.name, adapter.scale),) if adapter is not None else ()
        self.config: ModelConfig = router.config
        self._ctx = ctx
        self._ticket = ticket
        self._metrics = metrics
        self._labels = {"model_name": router.config.name}
        limits = router.config.limits
        ttft = limits.ttft_timeout_s or settings.ttft_timeout_s
        total = limits.request_timeout_s or settings.request_timeout_s
        self._ttft_s, self._total_s = ttft, total
        self._ttft_deadline = None if ttft is None else ctx.started + ttft
        self._total_deadline = None if total is None else ctx.started + total
        self._queued_observed = False

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
        """Wait for a running slot (no-op when one was free), under the first-token deadline."""
        deadline = _earliest(self._ttft_deadline, self._total_deadline)
        expired = self._ttft_expired if deadline == self._ttft_deadline else self._total_expired
        queued = await self._ctx.bounded(self._ticket.wait(), deadline, expired)
        if not self._queued_observed:
            self._queued_observed = True
            self._metrics.queue_time.observe(self._labels, queued)

    def _engine_id(self, request_id: str) -> str:
        return f"{self._ctx.request_id}/{request_id}"

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        await self._admitted()
        request = dataclasses.replace(
            request, request_id=self._engine_id(request.request_id), lora=self._lora
        )
        loop = asyncio.get_running_loop()
        stream = self._router.generate(request)
        first_at: float | None = None
        last: Delta | None = None
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
                last = delta
                yield delta
        finally:
            close = getattr(stream, "aclose", None)  # an async generator: close it if we left early
            if close is not None:
                await close()
            self._record(last, first_at, loop.time())

    def _record(self, last: Delta | None, first_at: float | None, end: float) -> None:
        if last is None:
            return
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

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        await self._admitted()
        request = dataclasses.replace(request, request_id=self._engine_id(request.request_id))
        result = await self._ctx.bounded(
            self._router.embed(request), self._total_deadline, self._total_expired
        )
        self._record_whole(result.prompt_tokens)
        return result

    async def rank(self, request: RankRequest) -> RankResult:
        """A cross-encoder's logits: admission, deadline and metrics as for `embed`."""
        await self._admitted()
        request = dataclasses.replace(request, request_id=self._engine_id(request.request_id))
        result = await self._ctx.bounded(
            self._router.rank(request), self._total_deadline, self._total_expired
        )
        self._record_whole(result.prompt_tokens)
        return result

    def _record_whole(self, prompt_tokens: int) -> None:
        """Metrics of a call answered whole (no tokens generated): prompt tokens, success, e2e."""
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


def open_model(request: Request, router: ModelRouter, adapter: AdapterConfig | None = None) -> ModelHandle:
    """Admit the request to `router`'s model (or refuse it with 429) and wrap the router; `adapter`:
    the LoRA adapter the body named as its `model`, applied to every sequence."""
    state = request.app.state
    ctx = request_context(request)
    ctx.model = router.config.name
    admission: Admission = state.admission
    metrics: GatewayMetrics = state.metrics
    gate = admission.gate(router.config.name, router.config.limits)
    try:
        ticket = gate.enter()
    except RateLimitError:
        metrics.rejected.inc({"model_name": router.config.name, "reason": "queue_full"})
        raise
    ctx.on_close(ticket.release)
    return ModelHandle(router, ctx, ticket, metrics, state.settings, adapter)
