"""A reasoning model on vLLM: which requests' grammars wait for the end marker, and where the
logits processor (backends/engines/vllm/thinking_end.py) reads a request's thinking to stand. The
processor itself runs in vLLM's EngineCore: tests/e2e/vllm/test_vllm_reasoning.py drives it."""

from __future__ import annotations

from raygate.backends.engines.reasoning import ThinkingPlan
from raygate.backends.engines.vllm.thinking_track import THINKING_EXTRA_KEY, ThinkingTrack
from raygate.backends.engines.vllm.translate import starts_thinking, thinking_args

START, END, EOS = 6, 7, 2


def plan(parser: str, prompt: str) -> ThinkingPlan:
    return ThinkingPlan(parser, prompt, None, [END])  # type: ignore[arg-type]


def test_the_grammar_waits_only_for_an_output_that_begins_in_thinking() -> None:
    assert starts_thinking(plan("qwen3", "open")) and starts_thinking(plan("deepseek_r1", "open"))
    # deepseek_r1 reads output without `<think>` as thinking; qwen3 answers unless one is opened.
    assert starts_thinking(plan("deepseek_r1", "none"))
    assert not starts_thinking(plan("qwen3", "none"))
    assert not starts_thinking(plan("qwen3", "closed")) and not starts_thinking(None)


def test_thinking_args_name_the_markers_and_the_ends_of_turn() -> None:
    args = thinking_args(plan("qwen3", "open"), START, END, [EOS])
    assert args == {THINKING_EXTRA_KEY: {"start": START, "end": END, "eos": [EOS], "open": True}}
    assert thinking_args(plan("qwen3", "none"), START, END, [EOS])[THINKING_EXTRA_KEY]["open"] is False  # type: ignore[index]
    assert thinking_args(plan("qwen3", "closed"), START, END, [EOS]) is None
    assert thinking_args(None, START, END, [EOS]) is None


def test_track_reads_the_growing_output() -> None:
    out: list[int] = []
    track = ThinkingTrack({"start": START, "end": END, "eos": [EOS, END], "open": True}, out)
    assert track.eos == [EOS]  # the marker itself is never moved onto itself
    assert track.read() == "thinking"
    out += [40, 41]
    assert track.read() == "thinking"
    out += [END, 50]
    assert track.read() == "answer"
    out += [START]
    assert track.read() == "answer"  # a later `<think>` is answer text
    assert track.counted == 3  # two thinking tokens and the end marker, however they arrived


def test_track_before_an_opened_thinking() -> None:
    out: list[int] = []
    track = ThinkingTrack({"start": START, "end": END, "eos": [EOS], "open": False}, out)
    assert track.read() == "before"
    out.append(START)
    assert track.read() == "thinking"
    out += [40, END, 50, 51]  # one vLLM output: the rest of the thinking and the answer's start
    assert track.read() == "answer" and track.counted == 3
    other = ThinkingTrack({"start": START, "end": END, "eos": [EOS], "open": False}, [40])
    assert other.read() == "answer"  # answered at once: nothing to keep open
