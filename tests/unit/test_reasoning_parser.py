"""The reasoning splitter (backends/engines/reasoning.py) and the per-request thinking controls
(protocol/reasoning.py), without a model: markers split anywhere across pieces, outputs without
an end marker, and each parser's start states."""

from __future__ import annotations

import pytest

from raygate.backends.engines import reasoning
from raygate.backends.engines.reasoning import ReasoningSplitter, closing_text, detect, prompt_state
from raygate.protocol.capabilities import ReasoningConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.reasoning import thinking_control


def split(splitter: ReasoningSplitter, pieces: list[str]) -> tuple[str, str]:
    thought, answer = "", ""
    for piece in pieces:
        t, a = splitter.push(piece)
        thought, answer = thought + t, answer + a
    t, a = splitter.finish()
    return thought + t, answer + a


TEXT = "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4."


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_every_cut_of_the_markers_gives_the_same_split(parser: str) -> None:
    """Split at every position, and one character at a time: the markers never leak."""
    expected = ("\nLet me see: 2+2.\n", "It is 4.")
    assert split(ReasoningSplitter(parser), [TEXT]) == expected  # type: ignore[arg-type]
    for cut in range(len(TEXT) + 1):
        got = split(ReasoningSplitter(parser), [TEXT[:cut], TEXT[cut:]])  # type: ignore[arg-type]
        assert got == expected, cut
    assert split(ReasoningSplitter(parser), list(TEXT)) == expected  # type: ignore[arg-type]


def test_a_held_back_marker_prefix_is_released_when_it_is_not_one() -> None:
    s = ReasoningSplitter("deepseek_r1", "open")
    assert s.push("a </th") == ("a ", "")
    assert s.push("ings") == ("</things", "")
    assert s.thinking


def test_deepseek_without_an_end_marker_is_all_thinking() -> None:
    s = ReasoningSplitter("deepseek_r1")
    assert split(s, ["I am still ", "thinking"]) == ("I am still thinking", "")
    assert s.thinking and not s.ended


def test_qwen3_without_an_opening_marker_is_all_answer() -> None:
    s = ReasoningSplitter("qwen3")
    assert split(s, ["\n", "Hello", " there"]) == ("", "\nHello there")
    assert not s.thinking


def test_qwen3_thinking_opened_by_the_prompt_and_cut_short_stays_thinking() -> None:
    s = ReasoningSplitter("qwen3", "open")
    assert split(s, ["Hmm, ", "let me"]) == ("Hmm, let me", "")


def test_a_prompt_that_closed_thinking_starts_in_the_answer() -> None:
    for parser in ("deepseek_r1", "qwen3"):
        s = ReasoningSplitter(parser, "closed")  # type: ignore[arg-type]
        assert split(s, ["4"]) == ("", "4")


def test_prompt_states_and_closing() -> None:
    assert prompt_state("<|im_start|>assistant\n<think>\n") == "open"
    assert prompt_state("assistant\n<think>\n\n</think>\n\n") == "closed"
    assert prompt_state("assistant\n") == "none"
    assert closing_text("a\n<think>\n") == "\n\n</think>\n\n"
    assert closing_text("a\n") == "<think>\n\n</think>\n\n"
    assert closing_text("a<think>\n\n</think>\n\n") == ""


def test_parser_detection_and_resolution() -> None:
    assert detect("{% if enable_thinking %}<think>{% endif %}") == "qwen3"
    assert detect("{{ '<think>\\n' }}") == "deepseek_r1"
    assert detect("{{ messages }}") is None
    assert reasoning.resolve(None, "<think>") is None
    assert reasoning.resolve(ReasoningConfig(parser="none"), "<think>") is None
    fmt = reasoning.resolve(ReasoningConfig(budget=10), "<think> enable_thinking")
    assert fmt is not None and fmt.parser == "qwen3" and fmt.budget_for(None) == 10 and fmt.budget_for(3) == 3
    named = reasoning.resolve(ReasoningConfig(parser="deepseek_r1"), None)
    assert named is not None and named.parser == "deepseek_r1"


def test_thinking_controls() -> None:
    assert thinking_control(None, None, None) == (None, None, None)
    assert thinking_control(None, {"enable_thinking": False}, None) == (False, None, None)
    assert thinking_control("none", None, None) == (False, None, {"reasoning_effort": "none"})
    assert thinking_control("low", None, None) == (True, 512, {"reasoning_effort": "low"})
    assert thinking_control("low", None, 7)[1] == 7  # a named budget wins over the effort's
    assert thinking_control("high", {"enable_thinking": False, "x": 1}, None)[0] is False
    with pytest.raises(BadRequestError) as bad:
        thinking_control("extreme", None, None)
    assert bad.value.param == "reasoning_effort"
    with pytest.raises(BadRequestError):
        thinking_control(None, {"enable_thinking": "yes"}, None)


def _count(plan: reasoning.ThinkingPlan, pieces: list[str]) -> tuple[str, str, int | None]:
    """Feed one piece per token through a `DeltaBuilder`, as the llama.cpp engine does."""
    from raygate.backends.engines.deltas import DeltaBuilder

    builder = DeltaBuilder(3, None, plan)
    thought = answer = ""
    last = None
    for i, piece in enumerate(pieces):
        builder.n_out += 1
        last = builder.delta(piece, "stop" if i == len(pieces) - 1 else None)
        if last is not None:
            thought, answer = thought + last.reasoning, answer + last.text
    assert last is not None
    return thought, answer, last.reasoning_tokens


def test_thinking_tokens_are_counted_up_to_the_end_marker() -> None:
    opened = reasoning.ThinkingPlan("qwen3", "open", None, [7])
    assert _count(opened, ["a", " b", "</think>", "\n\n", "4"]) == ("a b", "4", 3)
    fresh = reasoning.ThinkingPlan("qwen3", "none", None, [7])
    assert _count(fresh, ["\n", "<think>", "x", "</think>", "4"]) == ("x", "4", 3)
    assert _count(fresh, ["\n", "Hi", "!"]) == ("", "\nHi!", 0)
    hidden = reasoning.ThinkingPlan("deepseek_r1", "none", None, [7], include=False)
    assert _count(hidden, ["a", "</think>", "b"]) == ("", "b", 2)
