"""`DeltaBuilder`: which tokens make a delta, without a model."""

from __future__ import annotations

from raygate.backends.engines import tool_calls
from raygate.backends.engines.deltas import DeltaBuilder


def test_a_token_whose_text_is_held_still_makes_an_empty_delta() -> None:
    """A character's first byte, or the start of a stop string, shows no text yet: the delta
    says a token came (vLLM's server streams an empty chunk for it), and only once."""
    builder = DeltaBuilder(4, None)
    builder.n_out = 1
    held = builder.delta("")
    assert held is not None and held.text == "" and held.completion_tokens == 1
    assert builder.delta("") is None  # no new token since: nothing to say
    builder.n_out = 2
    whole = builder.delta("é")
    assert whole is not None and whole.text == "é" and whole.completion_tokens == 2


def test_a_parser_holding_text_sends_nothing_meanwhile() -> None:
    """A tool call's opening tag is held on purpose, as vLLM's parsers hold it: no empty deltas."""
    builder = DeltaBuilder(4, tool_calls.ToolCallParser())
    builder.n_out = 1
    assert builder.delta("<tool_") is None
    builder.n_out = 2
    last = builder.delta("", "stop")
    assert last is not None and last.finish_reason == "stop" and last.text == "<tool_"
