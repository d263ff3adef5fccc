"""The engine-neutral tool-call text format: parsing (streamed in any split), prompt rendering and
the call schema. Pure functions: no model needed."""

from __future__ import annotations

import json

import jsonschema
import pytest

from raygate.backends.engines.tool_calls import ToolCallParser, call_schema, render_messages
from raygate.protocol.generation import ChatMessage, FunctionTool, ToolCall, ToolCallDelta, ToolsSpec

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, {"x": "}"}]}}\n</tool_call>'


def feed(text: str, size: int) -> tuple[str, list[ToolCallDelta]]:
    parser = ToolCallParser()
    content, calls = "", []
    for i in range(0, len(text), size):
        c, k = parser.push(text[i : i + size])
        content, calls = content + c, calls + k
    c, k = parser.finish()
    assert parser.called == any(p.id for p in calls + k)
    return content + c, calls + k


def assemble(pieces: list[ToolCallDelta]) -> list[dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for p in pieces:
        call = calls.setdefault(p.index, {"id": "", "name": "", "arguments": ""})
        call["id"] = p.id or call["id"]
        call["name"] = p.name or call["name"]
        call["arguments"] += p.arguments
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_call_is_found_in_any_split(size: int) -> None:
    content, pieces = feed("Sure. " + CALL + "\n" + CALL.replace("Paris", "Rome"), size)
    assert content == "Sure. "
    calls = assemble(pieces)
    assert [c["name"] for c in calls] == ["get_weather", "get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": [1, {"x": "}"}]}
    assert json.loads(calls[1]["arguments"])["city"] == "Rome"
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    first = [p for p in pieces if p.index == 0]
    assert first[0].id and first[0].name == "get_weather" and all(p.id is None for p in first[1:])


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_arguments_stream_before_the_block_closes(size: int) -> None:
    parser = ToolCallParser()
    pieces: list[ToolCallDelta] = []
    half = CALL.index("Paris") + 3
    for i in range(0, half, size):
        pieces += parser.push(CALL[i : min(i + size, half)])[1]
    assert "".join(p.arguments for p in pieces).startswith('{"city": "Par')


def test_text_without_calls_passes_through() -> None:
    text = "a < b and <tool is not a tag; 1 < 2"
    for size in (1, 4, 100):
        content, calls = feed(text, size)
        assert content == text and calls == []


def test_other_key_order_and_unparseable_blocks() -> None:
    content, pieces = feed('<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', 3)
    assert content == "" and assemble(pieces) == [{"id": pieces[0].id, "name": "f", "arguments": '{"a": 1}'}]
    content, pieces = feed("<tool_call>not json</tool_call> after", 4)
    assert pieces == [] and content == "<tool_call>not json</tool_call> after"


def test_truncated_call_keeps_its_arguments_so_far() -> None:
    _, pieces = feed(CALL[: CALL.index("Paris")], 4)
    assert assemble(pieces)[0]["arguments"] == '{"city": "'


TOOL = FunctionTool(
    "get_weather", "Weather now", {"type": "object", "properties": {"city": {"type": "string"}}}
)


def test_render_history_for_any_template() -> None:
    messages = [
        ChatMessage("developer", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=[ToolCall("call_1", "get_weather", '{"city": "Paris"}')]),
        ChatMessage("tool", "18C", tool_call_id="call_1"),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
    ]
    out = render_messages(messages, ToolsSpec([TOOL], "auto"))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.") and '"name": "get_weather"' in out[0]["content"]
    assert (
        out[2]["content"]
        == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert out[3]["content"].count("<tool_response>") == 2
    assert render_messages(messages, ToolsSpec([TOOL], "none"))[0] == {
        "role": "system",
        "content": "Be brief.",
    }


def test_call_schema_accepts_calls_and_hoists_definitions() -> None:
    nested = FunctionTool(
        "book",
        None,
        {
            "type": "object",
            "properties": {"when": {"$ref": "#/$defs/Slot"}},
            "required": ["when"],
            "$defs": {
                "Slot": {"type": "object", "properties": {"day": {"type": "integer"}}, "required": ["day"]}
            },
        },
    )
    schema = call_schema([TOOL, nested])
    jsonschema.validate({"name": "book", "arguments": {"when": {"day": 3}}}, schema)
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "book", "arguments": {"when": {"day": "x"}}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "nope", "arguments": {}}, schema)
