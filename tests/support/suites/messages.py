"""Anthropic's Messages API through the `anthropic` SDK: create, stream (named events in order),
tools forced and auto with a tool_result round trip, count_tokens equal to a create's usage, and
bad requests answered in Anthropic's error shape.

Assertions are about structure the feature guarantees (event order, schema-valid input under forced
tools, a stop reason consistent with what came back), never about the words a tiny model writes.
A suite every backend passes: tests/e2e/test_messages.py runs it on the default (llama.cpp) gateway
and adds what only that gateway has; tests/e2e/vllm/test_vllm_messages.py reruns it on vLLM.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message, MessageParam, ToolParam

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL
from tests.support.structured import max_call_bytes, max_json_bytes
from tests.support.tools import TIME_PARAMS, WEATHER_PARAMS

# The same two tools as the chat tool-call suite, in Anthropic's shape.
WEATHER_SCHEMA, TIME_SCHEMA = WEATHER_PARAMS, TIME_PARAMS
TOOLS: list[ToolParam] = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_SCHEMA},
    {"name": "get_time", "description": "Current time in a time zone", "input_schema": TIME_SCHEMA},
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
# The longest text of one call to either tool (tests/support/structured.py): with parallel calls
# off, a forced call ends by itself (`tool_use`) within this many tokens on any machine. With them
# on, the model may go on calling until `max_tokens`.
CALL_TOKENS = max_call_bytes(
    [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in TOOLS]
)
ASK: list[MessageParam] = [{"role": "user", "content": "What is the weather like in Paris?"}]
HELLO: list[MessageParam] = [{"role": "user", "content": "Say hello."}]
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}
# anthropic 2.x no longer lists the sampling fields; agents send them as extra body fields.
GREEDY = {"temperature": 0}


def check_message(message: Message, max_tokens: int) -> None:
    """What holds for every message, whatever the model wrote."""
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert message.stop_reason in STOP_REASONS
    # Anthropic's input_tokens leaves out what the cache held: 0 when a prompt repeats exactly.
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0
    assert 0 < message.usage.output_tokens <= max_tokens
    if message.stop_reason == "max_tokens":
        assert message.usage.output_tokens == max_tokens
    assert (message.stop_sequence is not None) == (message.stop_reason == "stop_sequence")
    uses = [b for b in message.content if b.type == "tool_use"]
    assert bool(uses) == (message.stop_reason == "tool_use") or message.stop_reason == "max_tokens"
    for block in message.content:
        assert block.type in ("text", "tool_use")
        if block.type == "text":
            assert block.text.strip()
    for use in uses:
        assert use.id.startswith("toolu_") and isinstance(use.input, dict)
    assert len({u.id for u in uses}) == len(uses)


def prompt_tokens(message: Message) -> int:
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


# -- create ----------------------------------------------------------------------------------------


def test_create_shape_and_usage(anthropic_client: anthropic.Anthropic, gateway: GatewayProcess) -> None:
    out = anthropic_client.messages.create(model=CHAT_MODEL, max_tokens=12, messages=HELLO)
    check_message(out, 12)
    assert out.model == CHAT_MODEL
    assert out.content and out.content[0].type == "text"
    # The raw body: Anthropic's keys, `stop_sequence` present (null), no OpenAI keys.
    r = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": CHAT_MODEL, "max_tokens": 4, "messages": HELLO},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    Message.model_validate(body)  # the SDK's own model of the wire format
    assert {"input_tokens", "output_tokens"} <= set(body["usage"])


def test_system_blocks_and_block_content(anthropic_client: anthropic.Anthropic) -> None:
    """`system` as text blocks and content as text blocks mean the same as plain strings."""
    plain = anthropic_client.messages.count_tokens(
        model=CHAT_MODEL, system="You are terse.", messages=[{"role": "user", "content": "Hi there"}]
    )
    blocks = anthropic_client.messages.count_tokens(
        model=CHAT_MODEL,
        system=[{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}
        ],
    )
    assert plain.input_tokens == blocks.input_tokens > 0
    out = anthropic_client.messages.create(
        model=CHAT_MODEL,
        max_tokens=8,
        system=[{"type": "text", "text": "You are terse."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "Say it again."},
        ],
    )
    check_message(out, 8)


def test_max_tokens_is_honoured(anthropic_client: anthropic.Anthropic) -> None:
    out = anthropic_client.messages.create(
        model=CHAT_MODEL,
        max_tokens=5,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Count from one to one hundred in words."}],
    )
    check_message(out, 5)
    assert out.stop_reason in ("max_tokens", "end_turn")


WEATHER_TODAY: list[MessageParam] = [
    {"role": "user", "content": "Describe the weather here today in a sentence."}
]


def stop_letters(anthropic_client: anthropic.Anthropic) -> list[str]:
    """Stop sequences this machine's greedy answer must hit: the last letter it writes, in both
    cases (another CPU writes other text, with or without any given letter: `Sunny and warm.`)."""
    full = anthropic_client.messages.create(
        model=CHAT_MODEL, max_tokens=60, extra_body=GREEDY, messages=WEATHER_TODAY
    )
    letters = [c for b in full.content if b.type == "text" for c in b.text if c.isalpha()]
    assert letters, full.content
    return sorted({letters[-1], letters[-1].lower(), letters[-1].upper()})


def test_stop_sequence_is_reported(anthropic_client: anthropic.Anthropic) -> None:
    """A stop taken from the greedy answer fires, is named, and never leaks."""
    stops = stop_letters(anthropic_client)
    out = anthropic_client.messages.create(
        model=CHAT_MODEL, max_tokens=60, extra_body=GREEDY, stop_sequences=stops, messages=WEATHER_TODAY
    )
    check_message(out, 60)
    assert out.stop_reason == "stop_sequence" and out.stop_sequence in stops
    text = "".join(b.text for b in out.content if b.type == "text")
    assert not any(stop in text for stop in stops)


def test_output_format_constrains_the_text(anthropic_client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 20}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    budget = max_json_bytes(schema)  # the schema's longest answer: it ends by itself on any CPU
    out = anthropic_client.messages.create(
        model=CHAT_MODEL,
        max_tokens=budget,
        messages=[{"role": "user", "content": "Name a colour, as JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    check_message(out, budget)
    assert out.stop_reason == "end_turn" and out.content[0].type == "text"
    jsonschema.validate(json.loads(out.content[0].text), schema)


# -- streaming -------------------------------------------------------------------------------------


def raw_events(
    gateway: GatewayProcess, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[Any]:
    """(event name, data) per SSE event, checking the framing: `event:` then `data:`, and the
    name equal to the data's `type`. Keep-alive comments are skipped."""
    with httpx.stream(
        "POST", f"{gateway.url}/v1/messages", json={**body, "stream": True}, headers=headers, timeout=300
    ) as r:
        assert r.status_code == 200, r.read().decode()
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = []
    for frame in raw.split("\n\n"):
        lines = [line for line in frame.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name, data = lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])
        assert data["type"] == name
        events.append((name, data))
    return events


def check_event_order(events: list[Any]) -> None:
    """message_start, then blocks (start, deltas, stop) numbered from 0, then message_delta and
    message_stop; `ping` anywhere."""
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    open_block: int | None = None
    expected = 0
    for name, data in events[1:-2]:
        if name == "ping":
            continue
        if name == "content_block_start":
            assert open_block is None and data["index"] == expected
            open_block, expected = data["index"], expected + 1
        elif name in ("content_block_delta", "content_block_stop"):
            assert data["index"] == open_block
            if name == "content_block_stop":
                open_block = None
        else:
            raise AssertionError(f"unexpected event {name} inside the message")
    assert open_block is None


def test_stream_events_in_order(gateway: GatewayProcess, anthropic_client: anthropic.Anthropic) -> None:
    body = {"model": CHAT_MODEL, "max_tokens": 16, "messages": HELLO}
    events = raw_events(gateway, body, headers={"anthropic-version": "2023-06-01"})
    check_event_order(events)
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    deltas = [d for n, d in events if n == "content_block_delta"]
    assert deltas and all(d["delta"]["type"] == "text_delta" for d in deltas)
    end = events[-2][1]
    assert end["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < end["usage"]["output_tokens"] <= 16
    # The prompt's size is known from the first event, and matches count_tokens.
    count = anthropic_client.messages.count_tokens(model=CHAT_MODEL, messages=HELLO).input_tokens
    usage = start["usage"]
    assert usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) == count


def test_sdk_stream_accumulates(anthropic_client: anthropic.Anthropic) -> None:
    with anthropic_client.messages.stream(model=CHAT_MODEL, max_tokens=16, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    check_message(final, 16)
    assert text == "".join(b.text for b in final.content if b.type == "text")


# -- tools -----------------------------------------------------------------------------------------


def tool_uses(message: Message) -> list[Any]:
    """The message's calls, each schema-valid; only a last one cut off by `max_tokens` (where the
    model may call freely, nothing bounds its length) has no input yet."""
    uses = [b for b in message.content if b.type == "tool_use"]
    for use in uses if message.stop_reason != "max_tokens" else uses[:-1]:
        jsonschema.validate(use.input, SCHEMAS[use.name])
    return uses


def test_any_forces_a_schema_valid_call(anthropic_client: anthropic.Anthropic) -> None:
    out = anthropic_client.messages.create(
        model=CHAT_MODEL,
        max_tokens=CALL_TOKENS,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body=GREEDY,
    )
    check_message(out, CALL_TOKENS)
    assert out.stop_reason == "tool_use"
    assert tool_uses(out)


def test_named_tool_forces_that_tool_once(anthropic_client: anthropic.Anthropic) -> None:
    out = anthropic_client.messages.create(
        model=CHAT_MODEL,
        max_tokens=CALL_TOKENS,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
    )
    check_message(out, CALL_TOKENS)
    uses = tool_uses(out)
    assert out.stop_reason == "tool_use" and [u.name for u in uses] == ["get_time"]


def test_none_never_calls(anthropic_client: anthropic.Anthropic) -> None:
    out = anthropic_client.messages.create(
        model=CHAT_MODEL, max_tokens=24, messages=ASK, tools=TOOLS, tool_choice={"type": "none"}
    )
    check_message(out, 24)
    assert not tool_uses(out) and out.stop_reason != "tool_use"


def test_tool_result_round_trip(anthropic_client: anthropic.Anthropic) -> None:
    """A forced call, its result sent back as a `tool_result` block, and the model free (auto) to
    answer or call again; count_tokens of the whole conversation matches the create's usage."""
    first = anthropic_client.messages.create(
        model=CHAT_MODEL,
        max_tokens=CALL_TOKENS,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body=GREEDY,
    )
    uses = tool_uses(first)
    assert first.stop_reason == "tool_use" and uses
    conversation: list[MessageParam] = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                *(
                    {
                        "type": "tool_result",
                        "tool_use_id": u.id,
                        "content": [{"type": "text", "text": "Sunny, 22"}],
                    }
                    for u in uses[:1]
                ),
                *(
                    {"type": "tool_result", "tool_use_id": u.id, "content": "unavailable", "is_error": True}
                    for u in uses[1:]
                ),
                {"type": "text", "text": "Thanks. Summarise it."},
            ],
        },
    ]
    second = anthropic_client.messages.create(
        model=CHAT_MODEL, max_tokens=40, messages=conversation, tools=TOOLS, tool_choice={"type": "auto"}
    )
    check_message(second, 40)
    tool_uses(second)  # a further call is allowed, and must be schema-valid unless cut off
    count = anthropic_client.messages.count_tokens(
        model=CHAT_MODEL, messages=conversation, tools=TOOLS, tool_choice={"type": "auto"}
    )
    assert count.input_tokens == prompt_tokens(second)


def test_streamed_input_json_parses_to_valid_input(
    gateway: GatewayProcess, anthropic_client: anthropic.Anthropic
) -> None:
    body = {
        "model": CHAT_MODEL,
        "max_tokens": CALL_TOKENS,
        "temperature": 0,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    }
    events = raw_events(gateway, body)
    check_event_order(events)
    starts = [d for n, d in events if n == "content_block_start" and d["content_block"]["type"] == "tool_use"]
    assert starts
    for start in starts:
        block = start["content_block"]
        assert block["name"] == "get_weather" and block["id"].startswith("toolu_") and block["input"] == {}
        pieces = [
            d["delta"]["partial_json"]
            for n, d in events
            if n == "content_block_delta" and d["index"] == start["index"]
        ]
        assert pieces and all(isinstance(p, str) for p in pieces)
        jsonschema.validate(json.loads("".join(pieces)), WEATHER_SCHEMA)
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    # The SDK assembles the same input from the same deltas.
    sdk_body = {k: v for k, v in body.items() if k != "temperature"}
    with anthropic_client.messages.stream(**sdk_body, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [u.name for u in tool_uses(final)][:1] == ["get_weather"]


# -- count_tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize("with_tools", [False, True])
def test_count_tokens_equals_create_usage(anthropic_client: anthropic.Anthropic, with_tools: bool) -> None:
    extra: dict[str, Any] = {"tools": TOOLS, "tool_choice": {"type": "auto"}} if with_tools else {}
    system = "You answer in one short sentence."
    count = anthropic_client.messages.count_tokens(model=CHAT_MODEL, system=system, messages=ASK, **extra)
    out = anthropic_client.messages.create(
        model=CHAT_MODEL, max_tokens=4, system=system, messages=ASK, **extra
    )
    assert count.input_tokens == prompt_tokens(out) > 0


# -- errors ----------------------------------------------------------------------------------------


def check_error(exc: anthropic.APIStatusError, status: int, kind: str) -> None:
    assert exc.status_code == status
    body = exc.response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}


def test_missing_max_tokens_is_400(gateway: GatewayProcess) -> None:
    r = httpx.post(f"{gateway.url}/v1/messages", json={"model": CHAT_MODEL, "messages": HELLO}, timeout=60)
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def test_bad_requests_are_400(anthropic_client: anthropic.Anthropic) -> None:
    bad: list[dict[str, Any]] = [
        {"messages": []},
        {"messages": [{"role": "system", "content": "x"}]},
        {"messages": HELLO, "temperature": 1.5},
        {"messages": HELLO, "tool_choice": {"type": "any"}},
        {"messages": HELLO, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
        {"messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
            ]
        },
        {"messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"messages": HELLO, "output_config": {"effort": "high"}},
        {
            "messages": HELLO,
            "tools": TOOLS,
            "output_format": {"type": "json_schema", "schema": WEATHER_SCHEMA},
        },
        {"messages": HELLO, "top_k": -1},
    ]
    for extra in bad:
        with pytest.raises(anthropic.BadRequestError) as info:
            anthropic_client.post(
                "/v1/messages", cast_to=Message, body={"model": CHAT_MODEL, "max_tokens": 8, **extra}
            )
        check_error(info.value, 400, "invalid_request_error")


def test_image_block_is_a_clear_400(anthropic_client: anthropic.Anthropic) -> None:
    image: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    messages: list[MessageParam] = [
        {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}
    ]
    with pytest.raises(anthropic.BadRequestError) as info:
        anthropic_client.messages.create(model=CHAT_MODEL, max_tokens=8, messages=messages)
    check_error(info.value, 400, "invalid_request_error")
    # A text-only model: the 400 names the model and the block.
    assert CHAT_MODEL in info.value.message and "messages[0].content[0].source" in info.value.message
    with pytest.raises(anthropic.BadRequestError) as info:
        anthropic_client.messages.count_tokens(model=CHAT_MODEL, messages=messages)
    check_error(info.value, 400, "invalid_request_error")


def test_unknown_model_and_route_are_404(
    anthropic_client: anthropic.Anthropic, gateway: GatewayProcess
) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        anthropic_client.messages.create(model="no-such-model", max_tokens=8, messages=HELLO)
    check_error(info.value, 404, "not_found_error")
    with pytest.raises(anthropic.NotFoundError) as info:
        anthropic_client.messages.count_tokens(model="no-such-model", messages=HELLO)
    check_error(info.value, 404, "not_found_error")
    r = httpx.post(f"{gateway.url}/v1/messages/batches", json={}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
