"""Assembling `Delta`s from decoded text, for any engine that decodes token by token."""

from __future__ import annotations

from raygate.backends.engines import tool_calls
from raygate.backends.engines.reasoning import ThinkingPlan
from raygate.protocol.generation import Delta, FinishReason, TokenLogprob, ToolCallDelta


class DeltaBuilder:
    """Turns decoded text into `Delta`s: splits a reasoning model's thinking from the answer
    (`thinking`), routes the answer through the tool-call parser when tools are on, and attaches
    the logprobs gathered since the previous delta."""

    def __init__(
        self, n_prompt: int, parser: tool_calls.ToolCallParser | None, thinking: ThinkingPlan | None = None
    ) -> None:
        self.n_prompt = n_prompt
        self.n_out = 0
        self.parser = parser
        self.thinking = thinking
        self.splitter = thinking.splitter() if thinking is not None else None
        self.reasoning_tokens = 0  # tokens generated while the sequence was thinking
        self._counted = 0  # of n_out, the tokens already classed as thinking or answer
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: list[TokenLogprob] | None = None
        # Prompt tokens the engine reused from its prefix cache, once it knows.
        self.cached_tokens: int | None = None
        # When it entered the engine's queue and left it for a slot (`Delta.queued`).
        self.queued: tuple[float, float] | None = None
        self._sent = 0  # n_out when the last delta went out

    def delta(
        self,
        text: str,
        finish: FinishReason | None = None,
        stop_sequence: str | None = None,
        reasoning_tokens: int | None = None,
    ) -> Delta | None:
        """`stop_sequence`: the stop string that ended the sequence, with `finish` `stop`.
        `reasoning_tokens`: the thinking tokens so far when the engine counts them by token id
        (vLLM, whose one output may hold the end marker and answer tokens together)."""
        calls: list[ToolCallDelta] = []
        reasoning = ""
        if self.splitter is not None:
            assert self.thinking is not None
            was = self.splitter.state
            reasoning, text = self.splitter.push(text)
            # Thinking tokens: those read while thinking, the one that opened it, the end marker.
            if (
                was == "thinking"
                or self.splitter.state == "thinking"
                or (self.splitter.ended and was == "before")
            ):
                self.reasoning_tokens += self.n_out - self._counted
            self._counted = self.n_out
            if reasoning_tokens is not None:
                self.reasoning_tokens = reasoning_tokens
            if finish is not None:
                more_reasoning, more_text = self.splitter.finish()
                reasoning, text = reasoning + more_reasoning, text + more_text
            if not self.thinking.include:
                reasoning = ""
        if self.parser is not None:
            text, calls = self.parser.push(text)
            if finish is not None:
                tail, more = self.parser.finish()
                text, calls = text + tail, calls + more
                if finish == "stop" and self.parser.called:
                    finish = "tool_calls"
        shown = text or reasoning or calls or self.logprobs or self.prompt_logprobs
        if finish is None and not shown and not self._progress():
            return None
        delta = Delta(
            text,
            self.n_out,
            self.n_prompt,
            finish,
            logprobs=self.logprobs or None,
            tool_calls=calls or None,
            prompt_logprobs=self.prompt_logprobs,
            stop_sequence=stop_sequence if finish == "stop" else None,
            cached_tokens=self.cached_tokens,
            reasoning=reasoning,
            reasoning_tokens=self.reasoning_tokens if self.splitter is not None else None,
            queued=self.queued,
        )
        self.logprobs, self.prompt_logprobs = [], None
        self._sent = self.n_out
        return delta

    def _progress(self) -> bool:
        """Whether tokens came that the text does not show yet (an unfinished UTF-8 character,
        the start of a stop string) on a stream that parses nothing: then an empty delta goes
        out, as `vllm serve` sends an empty chunk per token. A client's stream then keeps the
        engine's rhythm instead of a gap twice as long (a stall, to a client measuring
        inter-token latency) wherever a character spans two tokens. Tool calls and thinking
        hold text on purpose and send nothing meanwhile, as vLLM's parsers do."""
        return self.parser is None and self.splitter is None and self.n_out > self._sent
