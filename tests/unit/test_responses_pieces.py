"""The Responses API's pieces on their own: the SQLite store (a real file: owners, age and size
limits, reopening), the output builder (the event grammar for text, calls and cuts, and held-back
whitespace), and the request's conversion to engine messages. tests/e2e/test_responses.py runs them
end to end against real engines."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from raygate.backends.cluster.stores.response_db import ResponseDB, StoreLimits
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import Delta, ToolCallDelta
from raygate.protocol.response_items import engine_messages
from raygate.protocol.responses import CreateResponseRequest
from raygate.server.serving.response_output import OutputBuilder
from tests.support.openapi import validate

DAY = 86400.0


def test_store_owner_age_size_and_reopen(tmp_path: Path) -> None:
    t0 = time.time() - DAY - 10  # opening a database expires by the real clock
    path = tmp_path / "state" / "responses.sqlite3"
    db = ResponseDB(path, StoreLimits(max_age_s=DAY, max_bytes=10_000))
    db.put("resp_a", "key-a", "A" * 100, now=t0)
    assert db.get("resp_a", "key-a", now=t0) == "A" * 100
    assert db.get("resp_a", "key-b", now=t0) is None  # another key's: absent
    assert not db.delete("resp_a", "key-b")
    assert db.get("resp_a", "", now=t0) is None
    # Age: expired rows are never returned, and the next write deletes them.
    assert db.get("resp_a", "key-a", now=t0 + DAY + 1) is None
    db.put("resp_b", "key-a", "B" * 100, now=t0 + DAY + 1)
    assert db.count() == 1 and db.total_bytes == 100
    db.close()
    # The file outlives the process that wrote it.
    again = ResponseDB(path, StoreLimits(max_age_s=DAY * 10, max_bytes=10_000))
    assert again.get("resp_b", "key-a", now=t0 + DAY + 2) == "B" * 100
    assert again.total_bytes == 100
    assert again.delete("resp_b", "key-a") and again.count() == 0 and again.total_bytes == 0


def test_store_size_limit_evicts_oldest_first() -> None:
    db = ResponseDB(None, StoreLimits(max_age_s=DAY, max_bytes=250))
    for i in range(5):
        db.put(f"resp_{i}", "", "x" * 100, now=1000.0 + i)
    assert db.total_bytes <= 250
    kept = [i for i in range(5) if db.get(f"resp_{i}", "", now=1010.0) is not None]
    assert kept == [3, 4]
    db.put("resp_4", "", "y" * 50, now=1020.0)  # replacing counts the new size only
    assert db.total_bytes == 150


def _events(builder: OutputBuilder, deltas: list[Delta]) -> list[dict[str, Any]]:
    out = []
    for delta in deltas:
        out += [json.loads(e.to_json()) for e in builder.add(delta)]
    out += [json.loads(e.to_json()) for e in builder.close()]
    for event in out:
        validate(event, "ResponseStreamEvent")
    return out


def _delta(text: str = "", calls: list[ToolCallDelta] | None = None, finish: Any = None) -> Delta:
    return Delta(text=text, completion_tokens=1, prompt_tokens=1, finish_reason=finish, tool_calls=calls)


def test_builder_text_then_calls() -> None:
    builder = OutputBuilder()
    events = _events(
        builder,
        [
            _delta("Let me "),
            _delta("check."),
            _delta(calls=[ToolCallDelta(0, '{"city"', "call_1", "get_weather")]),
            _delta(calls=[ToolCallDelta(0, ': "Oslo"}')]),
            _delta(calls=[ToolCallDelta(1, "{}", "call_2", "get_time")], finish="tool_calls"),
        ],
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    message, first, second = builder.items
    assert message.type == "message" and message.content[0].text == "Let me check."
    assert (first.type, first.call_id, first.arguments) == ("function_call", "call_1", '{"city": "Oslo"}')
    assert (second.type, second.call_id, second.name) == ("function_call", "call_2", "get_time")
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2]


def test_builder_holds_back_leading_whitespace() -> None:
    builder = OutputBuilder()
    _events(builder, [_delta("\n"), _delta(calls=[ToolCallDelta(0, "{}", "c", "f")], finish="tool_calls")])
    assert [item.type for item in builder.items] == ["function_call"]

    builder = OutputBuilder()
    _events(builder, [_delta("\n"), _delta("Hi", finish="stop")])
    assert builder.items[0].type == "message" and builder.items[0].content[0].text == "\nHi"

    builder = OutputBuilder()  # nothing at all: still one (empty) message
    _events(builder, [_delta(finish="stop")])
    assert builder.items[0].type == "message" and builder.items[0].content[0].text == ""


def test_builder_cut_by_length_is_incomplete() -> None:
    builder = OutputBuilder()
    events = _events(builder, [_delta("Once upon", finish="length")])
    assert builder.status == "incomplete" and builder.items[0].status == "incomplete"
    assert events[-1]["item"]["status"] == "incomplete"


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_builder_reasoning_summary_events(finish: str) -> None:
    """Asked for (`reasoning.summary`), the reasoning item's summary carries the thinking, with
    OpenAI's summary events beside the reasoning text ones; not asked, none of them."""
    thought = [
        Delta(text="", completion_tokens=1, prompt_tokens=1, reasoning=t) for t in ("Two and ", "two.")
    ]
    builder = OutputBuilder(summary=True)
    # Cut by `length` while thinking, the summary part is `incomplete` too.
    events = _events(builder, [*thought, _delta("4" if finish == "stop" else "", finish=finish)])
    kinds = [e["type"] for e in events]
    assert kinds[: kinds.index("response.output_item.done") + 1] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ]
    item = builder.items[0]
    assert item.type == "reasoning"
    assert [p.model_dump() for p in item.summary] == [{"type": "summary_text", "text": "Two and two."}]
    assert item.content[0].text == "Two and two."
    done = next(e for e in events if e["type"] == "response.reasoning_summary_part.done")
    assert done.get("status") == ("incomplete" if finish == "length" else None)

    plain = OutputBuilder()
    kinds = [e["type"] for e in _events(plain, [*thought, _delta("4", finish="stop")])]
    assert not any("summary" in k for k in kinds) and plain.items[0].summary == []


def test_reasoning_summary_modes() -> None:
    def body(reasoning: dict[str, Any]) -> CreateResponseRequest:
        return CreateResponseRequest.model_validate({"model": "m", "input": "hi", "reasoning": reasoning})

    for mode in ("auto", "concise", "detailed"):
        assert body({"summary": mode}).wants_summary()
        assert body({"generate_summary": mode}).reasoning.echo()["summary"] == mode  # type: ignore[union-attr]
    assert not body({"effort": "low"}).wants_summary()
    with pytest.raises(ValueError):
        body({"summary": "verbose"})


def test_request_to_engine_messages() -> None:
    body = CreateResponseRequest.model_validate(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Checking."}],
                },
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
        }
    )
    messages = engine_messages(body.instructions, body.input_items())
    assert [(m.role, m.content) for m in messages] == [
        ("system", "Be brief."),
        ("user", "Weather in Oslo?"),
        ("assistant", "Checking."),  # the call folds into the assistant turn it follows
        ("tool", "sunny"),
    ]
    assert messages[2].tool_calls is not None and messages[2].tool_calls[0].name == "get_weather"
    assert messages[3].tool_call_id == "c1" and messages[3].name == "get_weather"


@pytest.mark.parametrize(
    ("tools", "named"),
    [
        ([{"type": "web_search"}], ["web_search"]),
        (
            [{"type": "file_search"}, {"type": "computer_use_preview"}],
            ["file_search", "computer_use_preview"],
        ),
    ],
)
def test_hosted_tools_are_refused_by_name(tools: list[dict[str, Any]], named: list[str]) -> None:
    body = CreateResponseRequest.model_validate({"model": "m", "input": "x", "tools": tools})
    with pytest.raises(BadRequestError) as err:
        body.tools_spec()
    assert err.value.param == "tools" and all(f"`{n}`" in err.value.message for n in named)
