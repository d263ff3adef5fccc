"""`Tally`: the deltas of a request's sequences gathered per choice, for non-streamed bodies and
for the usage that ends a stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from raygate.protocol.generation import Delta, FinishReason, TokenLogprob


@dataclass
class CallSoFar:
    """A tool call assembled from its streamed pieces."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class Tally:
    """Per-choice text, tool calls, logprobs, finish reason (and the stop string behind it), and
    token counts (cached prompt tokens too, where the engine says), for non-streamed bodies and
    usage."""

    texts: dict[int, list[str]] = field(default_factory=dict)
    finish: dict[int, FinishReason | None] = field(default_factory=dict)
    prompt_tokens: dict[int, int] = field(default_factory=dict)
    completion_tokens: dict[int, int] = field(default_factory=dict)
    logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    calls: dict[int, dict[int, CallSoFar]] = field(default_factory=dict)
    stop_sequences: dict[int, str] = field(default_factory=dict)
    cached_tokens: dict[int, int] = field(default_factory=dict)
    # A reasoning model's thinking, and the tokens it took (engines that count them).
    reasoning: dict[int, list[str]] = field(default_factory=dict)
    reasoning_tokens: dict[int, int] = field(default_factory=dict)

    def add(self, index: int, delta: Delta) -> None:
        self.texts.setdefault(index, []).append(delta.text)
        if delta.reasoning:
            self.reasoning.setdefault(index, []).append(delta.reasoning)
        if delta.reasoning_tokens is not None:
            self.reasoning_tokens[index] = delta.reasoning_tokens
        self.prompt_tokens[index] = delta.prompt_tokens
        self.completion_tokens[index] = delta.completion_tokens
        if delta.finish_reason is not None:
            self.finish[index] = delta.finish_reason
            if delta.stop_sequence is not None:
                self.stop_sequences[index] = delta.stop_sequence
        if delta.cached_tokens is not None:
            self.cached_tokens[index] = delta.cached_tokens
        if delta.logprobs:
            self.logprobs.setdefault(index, []).extend(delta.logprobs)
        if delta.prompt_logprobs:
            self.prompt_logprobs[index] = delta.prompt_logprobs
        for piece in delta.tool_calls or ():
            call = self.calls.setdefault(index, {}).setdefault(piece.index, CallSoFar())
            call.id = piece.id or call.id
            call.name = piece.name or call.name
            call.arguments.append(piece.arguments)

    def tool_calls(self, index: int) -> list[CallSoFar]:
        return [c for _, c in sorted(self.calls.get(index, {}).items())]

    def text(self, index: int) -> str:
        return "".join(self.texts.get(index, []))

    def thought(self, index: int) -> str | None:
        """Choice `index`'s thinking, None when it had none."""
        pieces = self.reasoning.get(index)
        return "".join(pieces) if pieces else None

    def thinking_tokens(self) -> int | None:
        """Thinking tokens of all choices, None when no engine counted any (not a reasoning model)."""
        return sum(self.reasoning_tokens.values()) if self.reasoning_tokens else None

    def usage_counts(self, samples_per_prompt: int) -> tuple[int, int, int | None]:
        """Prompt tokens (and those of them the cache held: None if the engine does not count
        them) count once per prompt, however many samples were drawn from it."""
        prompt = sum(n for i, n in self.prompt_tokens.items() if i % samples_per_prompt == 0)
        cached = [n for i, n in self.cached_tokens.items() if i % samples_per_prompt == 0]
        return prompt, sum(self.completion_tokens.values()), sum(cached) if cached else None
