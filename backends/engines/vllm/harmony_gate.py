"""Where gpt-oss's thinking ends, for vLLM's structured outputs: a grammar (json_schema, a forced
tool call) waits until the final channel opens, as the llama.cpp engine's sampler does.

vLLM's structured-output manager holds a grammar until its `reasoning_parser` says the reasoning
ended. Its own `openai_gptoss` parser only answers "ended" (the OpenAI server parses harmony with
`openai_harmony`, whose o200k vocabulary is a download), and `deepseek_r1` looks for one `</think>`
token. This parser looks for the token ids of `<|channel|>final<|message|>`: the answer begins
after that header, whether an analysis channel came first or not. Raygate's own splitter
(reasoning.py) still makes the text split; only the boundary is read here.

Loaded by vLLM's EngineCore process by module name (`reasoning_parser_plugin`, engine_args.py's
`HARMONY_GATE_PLUGIN`), never by the gateway: it imports vLLM at module level.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vllm.reasoning import ReasoningParser, ReasoningParserManager

from raygate.backends.engines.reasoning import HARMONY_CHANNEL, HARMONY_MESSAGE

NAME = "raygate_harmony"
FINAL_HEADER = HARMONY_CHANNEL + "final" + HARMONY_MESSAGE


def ends_at(ids: Sequence[int], header: Sequence[int]) -> int | None:
    """The index just past the last `header` in `ids`, or None."""
    n = len(header)
    for end in range(len(ids), n - 1, -1):
        if list(ids[end - n : end]) == list(header):
            return end
    return None


@ReasoningParserManager.register_module(NAME)
class HarmonyGate(ReasoningParser):
    """The end of thinking is the final channel's header (`<|channel|>final<|message|>`)."""

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.header = list(tokenizer.encode(FINAL_HEADER, add_special_tokens=False))

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return ends_at(input_ids, self.header) is not None

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Iterable[int]) -> bool:
        """Whether the header ends within this step's tokens (the last `len(delta_ids)`): vLLM
        pops them one by one to find the first token the grammar binds."""
        delta = len(list(delta_ids))
        if delta == 0:
            return False
        tail = list(input_ids[-(delta + len(self.header) - 1) :])
        end = ends_at(tail, self.header)
        return end is not None and end > len(tail) - delta

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        end = ends_at(input_ids, self.header)
        return [] if end is None else input_ids[end:]

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        raise NotImplementedError("Raygate splits the text itself (backends/engines/reasoning.py).")

    def extract_reasoning_streaming(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("Raygate splits the text itself (backends/engines/reasoning.py).")
