"""Where one request's output stands in its thinking, shared by the two sides of the thinking-end
logits processor: translate.py, which opts a request in and counts its thinking tokens as they stream, and
thinking_end.py, which vLLM's EngineCore loads by name. It is its own module because
thinking_end.py imports torch and vLLM at module level and translate.py must not.
"""

from __future__ import annotations

from typing import Any

# The `SamplingParams.extra_args` key a request opts in to thinking_end.py's logits processor with
# (docs/reasoning.md; engine_args.py names the processor for the engine).
THINKING_EXTRA_KEY = "raygate_thinking"


class ThinkingTrack:
    """Where one request's output stands in its thinking, read by token id as it grows (thinking_end.py;
    `tokens` is vLLM's live output list): `before` a `<think>` the model may open, `thinking`
    until the end marker, then `answer`. `spec` is `translate.thinking_args`'s. `counted`: the
    thinking tokens so far (the `<think>` that opened it and the end marker included), exact
    however many tokens one of vLLM's outputs brings (the text split cannot tell them apart)."""

    __slots__ = ("counted", "end", "eos", "seen", "start", "state", "tokens")

    def __init__(self, spec: dict[str, Any], tokens: list[int]) -> None:
        self.start = int(spec["start"])
        self.end = int(spec["end"])
        self.eos = [int(t) for t in spec["eos"] if int(t) != self.end]
        self.tokens = tokens
        self.seen = 0
        self.counted = 0
        self.state = "thinking" if spec["open"] else "before"

    def read(self) -> str:
        """Reads the tokens since the last call; the state the next token is drawn in."""
        tokens, n = self.tokens, len(self.tokens)
        while self.seen < n and self.state != "answer":
            token = tokens[self.seen]
            if self.state == "before":
                self.state = "thinking" if token == self.start else "answer"
            elif token == self.end:
                self.state = "answer"
            self.counted += self.state == "thinking" or token == self.end
            self.seen += 1
        return self.state
