"""What both llama.cpp engines do with each token they sample for one sequence.

The one-sequence engine (`engine.py`) and the batched one (`batched.py`) differ only in how they
decode: one context per request, or one shared batch (the prompt side they share is `model.py`). Everything a
sampled token then goes through is here, once, so the two cannot drift apart: end of generation,
logprobs (from that token's own logits row), UTF-8 reassembly, stop strings, the token budget,
tool-call parsing and the deltas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np

from raygate.backends.engines import tool_calls
from raygate.backends.engines.base import EngineStats
from raygate.backends.engines.deltas import DeltaBuilder
from raygate.backends.engines.llama_cpp import logprobs
from raygate.backends.engines.llama_cpp.model import Prepared
from raygate.backends.engines.llama_cpp.sampling import TokenSampler
from raygate.backends.engines.text_stream import StopMatcher, Utf8Stream
from raygate.protocol.generation import Delta, FinishReason, GenerateRequest


class SequenceOutput:
    """One sequence's output side. Not thread-safe: one decode thread drives it."""

    def __init__(
        self,
        llm: Any,
        request: GenerateRequest,
        job: Prepared,
        emit: Callable[[Delta], None],
        stats: EngineStats,
    ) -> None:
        """`job`: the prepared request; a reasoning model's thinking steers its sampler (`_think`)."""
        self._llm = llm
        n_prompt, budget = len(job.prompt), job.budget
        self._top = request.sampling.logprobs
        self._budget = budget
        self._emit = emit
        self._stats = stats
        self._utf8 = Utf8Stream()
        sampling = request.sampling
        self._stops = StopMatcher(sampling.stop, sampling.include_stop_str_in_output)
        self._stop_ids = frozenset(sampling.stop_token_ids)
        self._keep_stop_token = sampling.include_stop_str_in_output
        self._special = not sampling.skip_special_tokens
        parser = tool_calls.ToolCallParser() if tool_calls.active(request.tools) else None
        self.builder = DeltaBuilder(n_prompt, parser, job.thinking)
        self._sampler = job.sampler if self.builder.splitter is not None else None
        self._forced_end = False
        self._in_thought = False  # the sampler was told the sequence thinks
        if self._sampler is not None:
            self._think(self._sampler)

    def push(self, token: int, ctx: Any, row: int, kept: np.ndarray | None = None) -> bool:
        """Take a sampled `token` (drawn from batch index `row` of `ctx`, the raw context pointer,
        or from `kept`, logits the prompt cache kept). Returns True when the sequence has ended;
        its last delta has then been emitted."""
        if llama_cpp.llama_vocab_is_eog(self._llm._model.vocab, token):
            self.finish("stop")
            return True
        out = self.builder
        if self._top is not None:
            out.logprobs.append(logprobs.logprob_at(self._llm, ctx, row, token, self._top, kept))
        out.n_out += 1
        self._stats.tokens_generated_total += 1
        piece = self._llm.detokenize([token], special=self._special)
        if token in self._stop_ids:
            # vLLM's rule: a stop token counts as generated; its text is kept only on request.
            text, _ = self._stops.push(self._utf8.push(piece if self._keep_stop_token else b""))
            self._emit_last(text + self._stops.flush() + self._utf8.flush(), "stop")
            return True
        text, stopped = self._stops.push(self._utf8.push(piece))
        if stopped:
            self._emit_last(text, "stop", self._stops.matched)
            return True
        if out.n_out >= self._budget:
            self._emit_last(text + self._stops.flush() + self._utf8.flush(), "length")
            return True
        delta = out.delta(text)
        if delta is not None:
            self._emit(delta)
        if self._sampler is not None:
            self._think(self._sampler)
        return False

    def _think(self, sampler: TokenSampler) -> None:
        """After each token of a reasoning model: once the answer has begun, the output constraint
        applies; while it thinks, a spent budget forces the end marker (llama-server's
        `--reasoning-budget`), so the answer begins with the next token."""
        splitter, plan = self.builder.splitter, self.builder.thinking
        assert splitter is not None and plan is not None
        if splitter.state == "answer":
            sampler.arm()
            self._sampler = None
            return
        if splitter.state != "thinking":
            return  # `before` (qwen3): the output may still open `<think>`, or answer at once
        if not self._in_thought:
            vocab = self._llm._model.vocab
            sampler.think(plan.end_tokens, lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t)))
            self._in_thought = True
        if plan.budget is not None and not self._forced_end and self.builder.reasoning_tokens >= plan.budget:
            sampler.force(plan.end_tokens)
            self._forced_end = True

    def finish(self, reason: FinishReason) -> None:
        """End before the budget: end of generation, or `abort` (the cancel flag)."""
        tail, _ = self._stops.push(self._utf8.flush())
        self._emit_last(tail + self._stops.flush(), reason)

    def _emit_last(self, text: str, reason: FinishReason, stop_sequence: str | None = None) -> None:
        delta = self.builder.delta(text, reason, stop_sequence)
        assert delta is not None  # a finish reason always makes a delta
        self._emit(delta)
