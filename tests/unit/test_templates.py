"""Per-token chunks rendered from a template are byte-identical to the pydantic model's JSON."""

from __future__ import annotations

import pytest

from raygate.protocol.chat import ChatChunkChoice, ChatCompletionChunk, ChatDelta
from raygate.protocol.completions import Completion, CompletionChoice
from raygate.protocol.templates import TextTemplate, text_marker

TEXTS = [
    "",
    " hello",
    'quote " backslash \\ slash / tab \t newline \n cr \r',
    "controls \x00\x01\x1f\x7f",
    "unicode é ß 中文 🎉 \u2028 \u2029 \ufeff",
    "</script><!--",
    "x" * 5000,
]


def chat_chunk(text: str, index: int) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id="chatcmpl-1",
        created=1700000000,
        model='m"odel\\',
        choices=[ChatChunkChoice(index=index, delta=ChatDelta(content=text))],
    )


def completion_chunk(text: str, index: int) -> Completion:
    return Completion(
        id="cmpl-1",
        created=1700000000,
        model="model/é",
        choices=[CompletionChoice(index=index, text=text, finish_reason=None)],
    )


@pytest.mark.parametrize("build", [chat_chunk, completion_chunk])
@pytest.mark.parametrize("text", TEXTS)
def test_template_matches_model(build, text: str) -> None:  # type: ignore[no-untyped-def]
    marker = text_marker()
    for index in (0, 3):
        template = TextTemplate(build(marker, index), marker)
        assert template.render(text) == build(text, index).to_json()


def test_marker_must_appear_once() -> None:
    with pytest.raises(ValueError):
        TextTemplate(completion_chunk("no marker here", 0), text_marker())
