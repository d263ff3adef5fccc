"""The thinking budget as vLLM's `thinking_token_budget`: vLLM counts from the last `<think>` of
the prompt and excludes one the model writes, llama.cpp counts generated thinking tokens with
that `<think>`; the translation makes both force the end marker after the same output."""

from __future__ import annotations

from raygate.backends.engines.reasoning import ThinkingPlan
from raygate.backends.engines.vllm.translate import vllm_thinking_budget

START = [6]  # `<think>` as tiny-reasoner's tokenizer has it
END = [7]


def plan(prompt: str, budget: int | None) -> ThinkingPlan:
    return ThinkingPlan("qwen3", prompt, budget, END)  # type: ignore[arg-type]


def test_prompt_tokens_after_the_opening_marker_are_added() -> None:
    # `...assistant\n<think>\n`: one token (`\n`) after the marker counts against vLLM's budget.
    assert vllm_thinking_budget(plan("open", 4), [1, 2, 6, 9], START) == 5
    assert vllm_thinking_budget(plan("open", 0), [1, 6], START) == 0
    # The last marker counts (an earlier turn's thinking is not this one).
    assert vllm_thinking_budget(plan("open", 2), [6, 9, 7, 3, 6, 9, 9], START) == 4


def test_a_marker_the_model_writes_is_counted_as_llama_cpp_counts_it() -> None:
    assert vllm_thinking_budget(plan("none", 4), [1, 2], START) == 3
    assert vllm_thinking_budget(plan("none", 0), [1, 2], START) == 0


def test_no_budget_when_none_is_set_or_thinking_is_closed() -> None:
    assert vllm_thinking_budget(None, [1, 6], START) is None
    assert vllm_thinking_budget(plan("open", None), [1, 6], START) is None
    assert vllm_thinking_budget(plan("closed", 4), [1, 6, 7], START) is None
