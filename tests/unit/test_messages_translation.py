"""The Messages API's translation layer without a model: requests into the engine types chat uses,
deltas into content-block events, Anthropic's SSE framing and error bodies, and the two ways a
key may be presented."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from raygate.protocol.errors import (
    AuthenticationError,
    BadRequestError,
    GatewayTimeoutError,
    ModelNotFoundError,
    RateLimitError,
    ServiceUnavailableError,
)
from raygate.protocol.generation import Delta, ToolCallDelta
from raygate.protocol.messages import CountTokensRequest, MessagesRequest
from raygate.protocol.messages_response import ErrorEvent, MessagesUsage, stop_reason
from raygate.server.access.auth import presented_key
from raygate.server.serving.message_blocks import BlockStream
from raygate.server.serving.messages import ANTHROPIC_SSE
from raygate.server.serving.streaming import Event, _frames
from raygate.server.transport.errors import error_body

TOOL = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}


def request(**fields: object) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, **fields})


def test_conversation_becomes_chat_messages() -> None:
    body = request(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        messages=[
            {"role": "user", "content": "Time in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"zone": "CET"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "12:00"}],
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": True},
                    {"type": "text", "text": "And?"},
                ],
            },
        ],
    )
    out = body.to_engine_messages()
    assert [(m.role, m.content) for m in out] == [
        ("system", "Be brief."),
        ("user", "Time in Paris?"),
        ("assistant", "Let me check."),
        ("tool", "12:00"),
        ("tool", "Error: down"),
        ("user", "And?"),
    ]
    calls = out[2].tool_calls
    assert calls is not None and (calls[0].id, calls[0].name, json.loads(calls[0].arguments)) == (
        "toolu_1",
        "get_time",
        {"zone": "CET"},
    )
    assert [m.tool_call_id for m in out[3:5]] == ["toolu_1", "toolu_2"]


@pytest.mark.parametrize(
    ("choice", "mode", "name", "parallel"),
    [
        (None, "auto", None, True),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", None, False),
        ({"type": "any"}, "required", None, True),
        ({"type": "tool", "name": "get_time"}, "function", "get_time", True),
        ({"type": "none"}, "none", None, True),
    ],
)
def test_tool_choice_maps_onto_the_chat_spec(
    choice: object, mode: str, name: str | None, parallel: bool
) -> None:
    spec = request(messages=[{"role": "user", "content": "x"}], tools=[TOOL], tool_choice=choice).tools_spec()
    assert spec is not None and (spec.choice, spec.name, spec.parallel) == (mode, name, parallel)
    assert spec.tools[0].parameters == TOOL["input_schema"]


def test_image_and_misplaced_blocks_are_refused_by_name() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    # Without an image reader (a path that reads text only), an image is a 400 naming its field.
    with pytest.raises(BadRequestError, match=r"image input is not supported here") as info:
        CountTokensRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": [image]}]}
        ).to_engine_messages()
    assert info.value.param == "messages[0].content[0].source"
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    with pytest.raises(BadRequestError, match=r"`document`") as info:
        request(messages=[{"role": "user", "content": [document]}]).to_engine_messages()
    assert info.value.param == "messages[0].content[0]"
    with pytest.raises(BadRequestError, match="assistant turns"):
        request(
            messages=[
                {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
            ]
        ).to_engine_messages()


def test_sampling_fields() -> None:
    sampling = request(
        messages=[{"role": "user", "content": "x"}], temperature=0.5, top_k=3, stop_sequences=["END"]
    ).to_sampling_params()
    assert (sampling.max_tokens, sampling.temperature, sampling.top_k, sampling.stop) == (8, 0.5, 3, ["END"])
    schema = {"type": "object"}
    fmt = request(
        messages=[{"role": "user", "content": "x"}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert fmt.to_sampling_params().json_schema == schema


def test_stop_reasons_and_usage() -> None:
    assert stop_reason("stop", None) == "end_turn"
    assert stop_reason("stop", "END") == "stop_sequence"
    assert stop_reason("length", None) == "max_tokens"
    assert stop_reason("tool_calls", None) == "tool_use"
    usage = MessagesUsage.of(100, 5, 60)
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (40, 60)
    assert json.loads(MessagesUsage.of(10, 1, None).to_json()) == {"input_tokens": 10, "output_tokens": 1}


def _names(events: list[Event]) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for e in events:
        data = json.loads(e.data)
        assert data["type"] == e.name
        out.append((e.name, data.get("index")))
    return out


def test_blocks_open_and_close_around_text_and_calls() -> None:
    blocks = BlockStream()
    events = [
        *blocks.push(Delta("\n", 1, 5)),  # whitespace alone opens nothing
        *blocks.push(Delta("Hi", 2, 5)),
        *blocks.push(Delta("", 3, 5, tool_calls=[ToolCallDelta(0, "", "call_abc", "get_time")])),
        *blocks.push(Delta("", 4, 5, tool_calls=[ToolCallDelta(0, '{"zone": "CET"}')])),
        *blocks.close(),
    ]
    assert _names(events) == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
    ]
    assert json.loads(events[1].data)["delta"] == {"type": "text_delta", "text": "\nHi"}
    start = json.loads(events[3].data)["content_block"]
    assert start == {"type": "tool_use", "id": "toolu_abc", "name": "get_time", "input": {}}
    assert json.loads(events[4].data)["delta"] == {
        "type": "input_json_delta",
        "partial_json": '{"zone": "CET"}',
    }
    assert blocks.close() == []


async def _payloads(fail: Exception) -> AsyncIterator[str | Event]:
    yield Event("message_start", '{"type":"message_start"}')
    raise fail


async def test_anthropic_frames_name_each_event_and_end_without_done() -> None:
    body = b"".join([c async for c in _frames(None, _payloads(BadRequestError("late")), ANTHROPIC_SSE)])
    frames = body.split(b"\n\n")
    assert frames[0] == b'event: message_start\ndata: {"type":"message_start"}'
    name, data = frames[1].split(b"\n")
    assert name == b"event: error"
    assert json.loads(data.removeprefix(b"data: ")) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "late"},
    }
    assert frames[2:] == [b""]


def test_error_bodies_by_route() -> None:
    cases = [
        (BadRequestError("x"), "invalid_request_error"),
        (AuthenticationError("x"), "authentication_error"),
        (ModelNotFoundError("x"), "not_found_error"),
        (RateLimitError("x"), "rate_limit_error"),
        (ServiceUnavailableError("x"), "overloaded_error"),
        (GatewayTimeoutError("x"), "timeout_error"),
    ]
    for exc, kind in cases:
        assert error_body(exc, "/v1/messages") == {"type": "error", "error": {"type": kind, "message": "x"}}
        assert error_body(exc, "/v1/messages/count_tokens") == ErrorEvent.of(exc).model_dump()
        assert error_body(exc, "/v1/chat/completions") == exc.to_body()
        assert error_body(exc, "/v1/messagesX") == exc.to_body()


def test_key_from_either_header() -> None:
    assert presented_key(["Bearer sk-a"], []) == "sk-a"
    assert presented_key([], ["sk-a"]) == "sk-a"
    assert presented_key(["Bearer sk-a"], ["sk-a"]) == "sk-a"
    for authorization, api_key in [
        ([], []),
        (["Bearer sk-a"], ["sk-b"]),
        ([], ["sk-a", "sk-a"]),
        ([], [""]),
        ([], ["sk a"]),
        (["Basic sk-a"], ["sk-a"]),
    ]:
        with pytest.raises(AuthenticationError):
            presented_key(authorization, api_key)
