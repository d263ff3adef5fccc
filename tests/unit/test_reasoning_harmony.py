"""gpt-oss's harmony channels as a reasoning parser (backends/engines/reasoning.py), without a
model: the analysis channel is the thinking, the final channel the answer, and the multi-token end
of thinking (`<|end|><|start|>assistant<|channel|>final<|message|>`) is found however the pieces
cut it; no marker or header reaches the client."""

from __future__ import annotations

import pytest

from raygate.backends.engines import reasoning
from raygate.backends.engines.reasoning import (
    HARMONY_END,
    ReasoningSplitter,
    closing_text,
    detect,
    prompt_state,
)
from raygate.protocol.capabilities import ReasoningConfig

OUTPUT = (
    "<|channel|>analysis<|message|>Let me see: 2+2.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 4.<|return|>"
)
EXPECTED = ("Let me see: 2+2.", "It is 4.")


def split(splitter: ReasoningSplitter, pieces: list[str]) -> tuple[str, str]:
    thought, answer = "", ""
    for piece in pieces:
        t, a = splitter.push(piece)
        thought, answer = thought + t, answer + a
    t, a = splitter.finish()
    return thought + t, answer + a


def test_every_cut_gives_the_same_split() -> None:
    assert split(ReasoningSplitter("harmony"), [OUTPUT]) == EXPECTED
    for cut in range(len(OUTPUT) + 1):
        for second in range(cut, len(OUTPUT) + 1, 7):
            pieces = [OUTPUT[:cut], OUTPUT[cut:second], OUTPUT[second:]]
            assert split(ReasoningSplitter("harmony"), pieces) == EXPECTED, (cut, second)
    assert split(ReasoningSplitter("harmony"), list(OUTPUT)) == EXPECTED


def test_the_end_is_seen_only_when_the_final_channel_starts() -> None:
    """The grammar and the budget go on while the next message's header is read: the thinking
    ends at the final channel's `<|message|>`, not at `<|end|>`."""
    s = ReasoningSplitter("harmony", "open")
    pieces = ["Hmm", "<|end|>", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Yes"]
    states = []
    for piece in pieces:
        s.push(piece)
        states.append(s.state)
    assert states[:-2] == ["thinking"] * 6
    assert states[-2:] == ["answer", "answer"] and s.ended


def test_a_second_analysis_message_is_thinking_too() -> None:
    text = "one<|end|><|start|>assistant<|channel|>analysis<|message|>two" + HARMONY_END + "done"
    assert split(ReasoningSplitter("harmony", "open"), list(text)) == ("onetwo", "done")


def test_a_forced_end_after_the_models_own_end_marker_still_reaches_the_answer() -> None:
    """A budget spent while the header is being read writes the whole end sequence again."""
    text = "think<|end|>" + HARMONY_END + "answer"
    assert split(ReasoningSplitter("harmony", "open"), list(text)) == ("think", "answer")


def test_output_without_a_header_is_all_answer_and_the_final_channel_alone_too() -> None:
    assert split(ReasoningSplitter("harmony"), list("plain text")) == ("", "plain text")
    assert split(ReasoningSplitter("harmony"), ["<|channel|>final<|message|>Hi<|end|>"]) == ("", "Hi")


def test_thinking_cut_off_stays_thinking_and_a_cut_header_is_dropped() -> None:
    assert split(ReasoningSplitter("harmony", "open"), ["still thinking<|en"]) == ("still thinking<|en", "")
    assert split(ReasoningSplitter("harmony", "open"), ["a<|end|><|start|>assistant<|chan"]) == ("a", "")


def test_prompt_states_detection_closing_and_the_alias() -> None:
    assert prompt_state("x<|start|>assistant<|channel|>analysis<|message|>", "harmony") == "open"
    assert prompt_state("x<|start|>assistant<|channel|>final<|message|>", "harmony") == "closed"
    assert prompt_state("x<|start|>assistant", "harmony") == "none"
    assert closing_text("x<|start|>assistant<|channel|>analysis<|message|>", "harmony") == HARMONY_END
    assert closing_text("x<|start|>assistant", "harmony").endswith(HARMONY_END)
    assert detect("{{ '<|start|>assistant<|channel|>' }}") == "harmony"
    assert reasoning.end_marker("harmony") == HARMONY_END
    assert not reasoning.can_disable("harmony") and reasoning.can_disable("qwen3")
    fmt = reasoning.resolve(ReasoningConfig(parser="openai_gptoss"), None)
    assert fmt is not None and fmt.parser == "harmony"


@pytest.mark.parametrize("parser", ["harmony", "openai_gptoss"])
def test_the_config_accepts_both_names(parser: str) -> None:
    assert ReasoningConfig(parser=parser).parser == parser  # type: ignore[arg-type]


def test_vllm_gets_the_harmony_markers_and_the_same_budget() -> None:
    """vLLM's `reasoning_config` takes the analysis header and the whole end sequence (it forces
    multi-token markers); a prompt that opened the analysis channel leaves the budget as it is."""
    from raygate.backends.engines.vllm.translate import vllm_thinking_budget

    assert reasoning.markers("openai_gptoss") == (reasoning.HARMONY_ANALYSIS, HARMONY_END)
    assert reasoning.markers("harmony") == (reasoning.HARMONY_ANALYSIS, HARMONY_END)
    assert reasoning.markers("auto") == (reasoning.START, reasoning.END)
    header = [4, 99, 5]  # `<|channel|>analysis<|message|>` as tiny-harmony's tokenizer has it
    plan = reasoning.ThinkingPlan("harmony", "open", 4, [6, 3, 520, 9531, 4, 17254, 5])
    assert vllm_thinking_budget(plan, [1, 3, 2, 3, 520, 9531, *header], header) == 4
