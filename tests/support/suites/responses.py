"""The Responses API (`/v1/responses`) through real clients against the running gateway: the openai
SDK's `responses.create` (plain, streamed, tools round trip, structured output), `retrieve`,
`delete`, `input_items.list`, `previous_response_id`, and bad input.

Every body and every stream event is validated against OpenAI's published spec. Assertions are
about what the feature guarantees (an item of the right type, schema-valid JSON under a format, a
function call under `tool_choice: required`, the event grammar), never the text a tiny model
writes. A suite every backend passes: tests/e2e/test_responses.py runs it on the default (llama.cpp)
gateway and adds the openai-agents `Runner` and the rest; tests/e2e/vllm/test_vllm_responses.py
reruns it on vLLM.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate
from tests.support.structured import check_json_object, max_call_bytes, max_json_bytes

WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}
# The longest text of one get_weather call (tests/support/structured.py): with parallel calls off,
# a forced call ends by itself within this many tokens on any machine. With them on (the default)
# the model may go on calling until `max_output_tokens`, and the last call is then cut off.
CALL_BUDGET = max_call_bytes([{"type": "function", "function": WEATHER_TOOL}])
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
# The longest answer PERSON allows: the budget that lets any CPU's greedy text end by itself.
PERSON_BUDGET = max_json_bytes(PERSON)
# A schema no answer can satisfy in 16 tokens: the output is cut by max_output_tokens.
LONG: dict[str, Any] = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 400}},
    "required": ["story"],
}


def post(base_url: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/responses", json={"model": CHAT_MODEL, **body}, timeout=120, **kw)


def sse_events(base_url: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A raw stream's (event name, data) pairs, as a client without the SDK reads them."""
    out: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream(
        "POST", f"{base_url}/responses", json={"model": CHAT_MODEL, "stream": True, **body}, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        name: str | None = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
                assert data != "[DONE]", "a Responses stream has no [DONE] frame"
                assert name is not None, "every data frame follows its event name"
                out.append((name, json.loads(data)))
                name = None
    return out


def check_event_grammar(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The documented order, sequence numbers 0..n-1, every event valid; returns the final response."""
    for i, (name, data) in enumerate(events):
        assert data["type"] == name
        assert data["sequence_number"] == i
        validate(data, "ResponseStreamEvent")
    types = [name for name, _ in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert events[0][1]["response"]["status"] == "in_progress"
    final = events[-1][1]["response"]
    # Between them: each output item opens, carries its pieces, and closes, in output order.
    body = events[2:-1]
    index = 0
    i = 0
    while i < len(body):
        name, data = body[i]
        assert name == "response.output_item.added" and data["output_index"] == index
        item = data["item"]
        assert item["status"] == "in_progress"
        j = i + 1
        if item["type"] == "message":
            assert body[j][0] == "response.content_part.added"
            j += 1
            text = ""
            while body[j][0] == "response.output_text.delta":
                assert body[j][1]["item_id"] == item["id"]
                text += body[j][1]["delta"]
                j += 1
            assert body[j][0] == "response.output_text.done" and body[j][1]["text"] == text
            assert body[j + 1][0] == "response.content_part.done"
            j += 2
            done = body[j][1]["item"]
            assert done["content"][0]["text"] == text
        else:
            assert item["type"] == "function_call"
            args = ""
            while body[j][0] == "response.function_call_arguments.delta":
                args += body[j][1]["delta"]
                j += 1
            assert body[j][0] == "response.function_call_arguments.done"
            assert body[j][1]["arguments"] == args and body[j][1]["name"] == item["name"]
            j += 1
            done = body[j][1]["item"]
            assert done["arguments"] == args
        assert body[j][0] == "response.output_item.done" and done["id"] == item["id"]
        assert final["output"][index] == done
        index += 1
        i = j + 1
    assert len(final["output"]) == index
    return final


# --- create --------------------------------------------------------------------------------------


def test_plain_create_shape_and_usage(client: openai.OpenAI, base_url: str) -> None:
    r = post(base_url, {"input": "Say hello.", "max_output_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, "Response")
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] in ("completed", "incomplete")
    assert body["output"][0]["type"] == "message" and body["output"][0]["role"] == "assistant"
    assert body["usage"]["input_tokens"] > 0 and 0 < body["usage"]["output_tokens"] <= 24
    assert body["usage"]["total_tokens"] == body["usage"]["input_tokens"] + body["usage"]["output_tokens"]
    assert body["store"] is True and body["max_output_tokens"] == 24

    sdk = client.responses.create(
        model=CHAT_MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
        instructions="You are terse.",
        max_output_tokens=24,
        temperature=0,
        metadata={"suite": "responses"},
        user="tester",
    )
    assert sdk.status in ("completed", "incomplete")
    assert isinstance(sdk.output_text, str)
    assert sdk.instructions == "You are terse." and sdk.metadata == {"suite": "responses"}
    assert sdk.user == "tester"


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI, base_url: str) -> None:
    fmt = {"type": "json_schema", "name": "story", "schema": LONG}
    r = post(base_url, {"input": "Tell a story.", "max_output_tokens": 16, "text": {"format": fmt}})
    body = r.json()
    validate(body, "Response")
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][-1]["status"] == "incomplete"
    assert body["usage"]["output_tokens"] == 16

    events = sse_events(
        base_url, {"input": "Tell a story.", "max_output_tokens": 16, "text": {"format": fmt}}
    )
    final = check_event_grammar(events)
    assert events[-1][0] == "response.incomplete" and final["status"] == "incomplete"


def test_stream_event_sequence(client: openai.OpenAI, base_url: str) -> None:
    events = sse_events(base_url, {"input": "Count to five.", "max_output_tokens": 40, "temperature": 0})
    final = check_event_grammar(events)
    assert [n for n, _ in events].count("response.output_text.delta") >= 2  # streamed, not one lump
    # The stored response is the one the stream ended with.
    stored = httpx.get(f"{base_url}/responses/{final['id']}", timeout=30).json()
    assert stored["output"] == final["output"] and stored["status"] == final["status"]

    # The SDK's own stream helper assembles the answer (it needs `response.completed`: a bounded
    # schema guarantees the answer ends within the token limit).
    fmt: Any = {"type": "json_schema", "name": "person", "schema": PERSON}
    with client.responses.stream(
        model=CHAT_MODEL, input="Describe Ada.", text={"format": fmt}, max_output_tokens=PERSON_BUDGET
    ) as stream:
        kinds = [event.type for event in stream]
        response = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.output_text == "".join(
        part.text for item in response.output if item.type == "message" for part in item.content
    )


# --- tools ---------------------------------------------------------------------------------------


def test_tools_round_trip(client: openai.OpenAI, base_url: str) -> None:
    """`required` forces a call with schema-valid arguments; the result goes back as a
    `function_call_output` item (in a full input list, and via `previous_response_id`)."""
    ask = [{"role": "user", "content": "What is the weather like in Paris?"}]
    r = post(
        base_url,
        {
            "input": ask,
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_output_tokens": CALL_BUDGET,
            "temperature": 0,
        },
    )
    body = r.json()
    validate(body, "Response")
    calls = [item for item in body["output"] if item["type"] == "function_call"]
    assert calls and all(c["name"] == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), WEATHER_PARAMS)
        assert call["call_id"] and call["id"].startswith("fc_") and call["status"] == "completed"
    assert body["status"] == "completed" and body["tool_choice"] == "required"
    assert body["tools"][0]["name"] == "get_weather"

    results = [
        {"type": "function_call_output", "call_id": c["call_id"], "output": '{"temperature_c": 21}'}
        for c in calls
    ]
    follow = client.responses.create(
        model=CHAT_MODEL,
        input=[*ask, *calls, *results],  # type: ignore[list-item]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=40,
    )
    assert follow.status in ("completed", "incomplete")
    assert [item.type for item in follow.output] == ["message"]

    chained = client.responses.create(
        model=CHAT_MODEL,
        previous_response_id=body["id"],
        input=results,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=40,
    )
    assert [item.type for item in chained.output] == ["message"]
    assert chained.previous_response_id == body["id"]
    assert chained.usage is not None and follow.usage is not None
    assert chained.usage.input_tokens == follow.usage.input_tokens  # the same conversation


def test_named_tool_choice_and_streamed_call(base_url: str) -> None:
    events = sse_events(
        base_url,
        {
            "input": "What is the weather in Oslo?",
            "tools": [WEATHER_TOOL, {**WEATHER_TOOL, "name": "get_time"}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
            "max_output_tokens": CALL_BUDGET,
            "temperature": 0,
        },
    )
    final = check_event_grammar(events)
    assert final["tool_choice"] == {"type": "function", "name": "get_weather"}
    calls = [item for item in final["output"] if item["type"] == "function_call"]
    assert calls and {c["name"] for c in calls} == {"get_weather"}
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), WEATHER_PARAMS)


def test_parallel_tool_calls_false_allows_one_call(base_url: str) -> None:
    body = post(
        base_url,
        {
            "input": "Weather in Paris and in Rome?",
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "temperature": 0,
        },
    ).json()
    validate(body, "Response")
    assert body["parallel_tool_calls"] is False
    assert [item["type"] for item in body["output"]] == ["function_call"]


# --- structured output ---------------------------------------------------------------------------


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)


def test_json_schema_output(client: openai.OpenAI, base_url: str) -> None:
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    body = post(
        base_url,
        {
            "input": "Describe a person called Ada as JSON.",
            "text": {"format": fmt},
            "max_output_tokens": PERSON_BUDGET,
        },
    ).json()
    validate(body, "Response")
    assert body["status"] == "completed"
    assert body["text"]["format"]["type"] == "json_schema" and body["text"]["format"]["schema"] == PERSON
    jsonschema.validate(json.loads(body["output"][0]["content"][0]["text"]), PERSON)

    parsed = client.responses.parse(
        model=CHAT_MODEL,
        input="Describe a person called Ada.",
        text_format=Person,
        max_output_tokens=PERSON_BUDGET,
    )
    assert isinstance(parsed.output_parsed, Person)

    streamed = sse_events(
        base_url,
        {"input": "Describe Bob as JSON.", "text": {"format": fmt}, "max_output_tokens": PERSON_BUDGET},
    )
    final = check_event_grammar(streamed)
    jsonschema.validate(json.loads(final["output"][0]["content"][0]["text"]), PERSON)


def test_json_object_output(client: openai.OpenAI) -> None:
    """`json_object` bounds nothing (chat's test_json_object): on one CPU SmolLM2 closes its object,
    on another it writes `{"answer": "The answer is: The answer is: ...` to the end. The answer is
    an object when the model ends it and the beginning of one when `max_output_tokens` cuts it off
    (then the response says so), under the least budget the API takes (16) and a larger one."""
    for budget in (16, 100):
        out = client.responses.create(
            model=CHAT_MODEL,
            input="Give me a JSON object with a key 'answer'.",
            text={"format": {"type": "json_object"}},
            max_output_tokens=budget,
            temperature=0,
        )
        assert out.status in ("completed", "incomplete"), out.status
        if out.status == "incomplete":
            assert out.incomplete_details is not None
            assert out.incomplete_details.reason == "max_output_tokens"
            assert out.usage is not None and out.usage.output_tokens == budget
        check_json_object(out.output_text, "stop" if out.status == "completed" else "length")


def test_chat_json_object_with_schema_is_a_constraint(base_url: str) -> None:
    """llama-cpp-python's / Together's `response_format: {type: json_object, schema}` (instructor's
    JSON_SCHEMA mode): the schema constrains the output, it is not ignored."""
    r = httpx.post(
        f"{base_url}/chat/completions",
        json={
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": "Describe a person called Ada as JSON."}],
            "max_tokens": PERSON_BUDGET,
            "response_format": {"type": "json_object", "schema": PERSON},
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, "CreateChatCompletionResponse")
    assert body["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), PERSON)


# --- stored responses ----------------------------------------------------------------------------


def test_retrieve_input_items_delete(client: openai.OpenAI, base_url: str) -> None:
    ask = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
    ]
    created = client.responses.create(model=CHAT_MODEL, input=ask, max_output_tokens=16)  # type: ignore[arg-type]
    raw = httpx.get(f"{base_url}/responses/{created.id}", timeout=30)
    assert raw.status_code == 200
    validate(raw.json(), "Response")
    got = client.responses.retrieve(created.id)
    assert got.model_dump() == created.model_dump()

    items = httpx.get(f"{base_url}/responses/{created.id}/input_items", timeout=30).json()
    validate(items, "ResponseItemList")
    assert [i["role"] for i in items["data"]] == ["user", "developer"]  # newest first by default
    page = client.responses.input_items.list(created.id, order="asc", limit=1)
    assert [i.role for i in page.data] == ["developer"] and page.has_more  # type: ignore[union-attr]
    rest = client.responses.input_items.list(created.id, order="asc", after=page.data[0].id)
    assert [i.role for i in rest.data] == ["user"]  # type: ignore[union-attr]
    assert items["data"][0]["content"] == [{"type": "input_text", "text": "Name a colour."}]

    deleted = httpx.delete(f"{base_url}/responses/{created.id}", timeout=30)
    assert deleted.status_code == 200 and deleted.json() == {
        "id": created.id,
        "object": "response",
        "deleted": True,
    }
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(created.id)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=CHAT_MODEL, input="My name is Ada. Say hi.", max_output_tokens=20, temperature=0
    )
    second = client.responses.create(
        model=CHAT_MODEL,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=20,
        temperature=0,
    )
    third = client.responses.create(
        model=CHAT_MODEL,
        input="Thanks.",
        previous_response_id=second.id,
        max_output_tokens=20,
        temperature=0,
    )
    assert first.usage and second.usage and third.usage
    # Each turn's prompt holds every earlier turn: the history was read from the store.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    # input_items lists a response's own input, not the history before it.
    assert [i.id for i in client.responses.input_items.list(third.id).data]
    assert len(client.responses.input_items.list(third.id).data) == 1


# --- bad input -----------------------------------------------------------------------------------


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize(
    ("body", "status", "param", "named"),
    [
        ({"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id", "resp_nope"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools", "web_search"),
        (
            {
                "input": "x",
                "tools": [{"type": "file_search"}, {"type": "computer_use_preview"}, WEATHER_TOOL],
            },
            400,
            "tools",
            "computer_use_preview",
        ),
        ({"input": "x", "background": True}, 400, "background", "background"),
        ({"input": "x", "max_output_tokens": 4}, 400, "max_output_tokens", None),
        ({"input": "x", "tool_choice": "required"}, 400, "tool_choice", None),
        (
            {"input": "x", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
            400,
            "tool_choice",
            "nope",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0].image_url",
            "text-only",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0]", "item_reference"),
        ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, 400, "metadata", None),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, 400, "text.format", None),
    ],
)
def test_bad_input(base_url: str, body: dict[str, Any], status: int, param: str, named: str | None) -> None:
    err = assert_error(post(base_url, body), status, param)
    if named is not None:
        assert named in err["message"]
