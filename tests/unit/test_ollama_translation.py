"""Ollama's translation layer without a model: requests into the OpenAI bodies the serving layer
runs (options, format, tools and their history, generate's three paths), the NDJSON framing and
Ollama's error body, the keyed paths and the admin path."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError

from raygate.protocol.chat import ChatCompletionRequest
from raygate.protocol.completions import CompletionRequest
from raygate.protocol.errors import BadRequestError, ModelNotFoundError
from raygate.protocol.ollama import ChatRequest, EmbedRequest, GenerateRequest
from raygate.protocol.ollama_response import ChatChunk, GenerateChunk, MessageOut
from raygate.server.access.admin_auth import is_admin_path
from raygate.server.serving.ollama import OLLAMA_NDJSON
from raygate.server.serving.streaming import _frames
from raygate.server.transport.errors import error_body
from raygate.server.transport.middleware import is_keyed

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def chat(**fields: object) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_options_map_to_openai_fields_and_only_those_sent() -> None:
    body = chat(
        options={
            "temperature": 0.2,
            "top_k": 5,
            "top_p": 0.9,
            "min_p": 0.05,
            "num_predict": 7,
            "stop": ["\n\n"],
            "seed": 3,
            "repeat_penalty": 1.3,
            "presence_penalty": 0.5,
            "frequency_penalty": 0.25,
            "num_thread": 4,  # Ollama's runner: no effect here
            "mirostat": None,  # LangChain sends unset options as null
        }
    ).to_openai("m")
    assert isinstance(body, ChatCompletionRequest)
    params = body.to_sampling_params()
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.2, 5, 0.9, 0.05)
    assert (params.max_tokens, params.stop, params.seed) == (7, ["\n\n"], 3)
    assert (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) == (1.3, 0.5, 0.25)
    # Unset options stay unset, so the model's `defaults:` fill them as on /v1.
    assert chat().to_openai("m").model_fields_set == {"model", "stream", "messages"}


@pytest.mark.parametrize("num_predict", [-1, -2, None])
def test_num_predict_until_done_is_no_budget(num_predict: int | None) -> None:
    assert chat(options={"num_predict": num_predict}).to_openai("m").to_sampling_params().max_tokens is None


@pytest.mark.parametrize(("option", "value"), [("mirostat", 2), ("tfs_z", 0.5), ("typical_p", 0.7)])
def test_sampling_options_without_an_engine_are_refused_by_name(option: str, value: float) -> None:
    with pytest.raises(BadRequestError) as err:
        chat(options={option: value}).to_openai("m")
    assert err.value.param == f"options.{option}" and option in err.value.message
    chat(options={option: {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}[option]}).to_openai("m")  # off


def test_format_json_and_schema_constrain_the_output() -> None:
    assert chat(format="json").to_openai("m").to_sampling_params().json_schema == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert chat(format=schema).to_openai("m").to_sampling_params().json_schema == schema
    assert chat(format="").to_openai("m").to_sampling_params().json_schema is None
    with pytest.raises(ValidationError):
        chat(format="yaml")


def test_tool_history_gets_call_ids_matched_by_tool_name() -> None:
    body = chat(
        messages=[
            {"role": "user", "content": "weather and time?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "get_time", "arguments": {"zone": "UTC"}}},
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                ],
            },
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "tool", "content": "noon"},
        ],
        tools=[WEATHER],
    ).to_openai("m")
    messages = body.to_engine_messages()
    calls = messages[1].tool_calls or []
    assert [c.name for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1].arguments) == {"city": "Paris"}  # an object becomes JSON text
    assert messages[2].tool_call_id == calls[1].id  # by name
    assert messages[3].tool_call_id == calls[0].id  # unnamed: the oldest unanswered
    spec = body.tools_spec()
    assert spec is not None and spec.choice == "auto" and [t.name for t in spec.tools] == ["get_weather"]


def test_generate_takes_chat_or_completions_path() -> None:
    templated = GenerateRequest(model="m", prompt="hi", system="be brief").to_openai("m")
    assert isinstance(templated, ChatCompletionRequest)
    assert [(m.role, m.content) for m in templated.messages] == [("system", "be brief"), ("user", "hi")]
    raw = GenerateRequest(model="m", prompt="2+2=", raw=True).to_openai("m")
    assert isinstance(raw, CompletionRequest) and raw.prompt == "2+2=" and raw.max_tokens is None
    fim = GenerateRequest(model="m", prompt="def f(", suffix="    return 1").to_openai("m")
    assert isinstance(fim, CompletionRequest) and fim.suffix == "    return 1"
    assert GenerateRequest(model="m").loads_only() and GenerateRequest(model="m", prompt="").loads_only()
    assert GenerateRequest(model="m", context=[1, 2]).refused() == "context"
    assert GenerateRequest(model="m", template="{{ .Prompt }}").refused() == "template"


def test_embed_input_forms() -> None:
    assert EmbedRequest(model="m", input="a").inputs() == ["a"]
    assert EmbedRequest(model="m", input=["a", "b"]).inputs() == ["a", "b"]
    for bad in ([], [""]):
        with pytest.raises(ValidationError):
            EmbedRequest.model_validate({"model": "m", "input": bad})


def test_errors_on_api_paths_take_ollamas_body() -> None:
    err = ModelNotFoundError("model 'x' not found", param="model")
    assert error_body(err, "/api/chat") == {"error": "model 'x' not found"}
    assert "error" in error_body(err, "/v1/chat/completions") and isinstance(
        error_body(err, "/v1/chat/completions")["error"], dict
    )


async def test_ndjson_frames_are_lines_and_a_late_error_is_a_line() -> None:
    async def payloads() -> AsyncIterator[str]:
        yield json.dumps({"response": "a", "done": False})
        raise BadRequestError("boom")

    body = b"".join([chunk async for chunk in _frames(None, payloads(), OLLAMA_NDJSON)])
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines == [{"response": "a", "done": False}, {"error": "boom"}]
    assert body.endswith(b"\n")


def test_keys_cover_the_api_but_its_probes_and_delete_wants_the_admin_key() -> None:
    assert is_keyed("/api/chat") and is_keyed("/api/tags") and is_keyed("/v1/models")
    assert not is_keyed("/api/version") and not is_keyed("/") and not is_keyed("/v1/cluster/auth")
    assert is_admin_path("DELETE", "/api/delete") and not is_admin_path("POST", "/api/chat")


def test_the_done_line_in_ollamas_order() -> None:
    line = ChatChunk(
        model="m",
        created_at="2026-01-01T00:00:00Z",
        message=MessageOut(content=""),
        done=True,
        done_reason="stop",
        total_duration=3,
        load_duration=0,
        prompt_eval_count=2,
        prompt_eval_duration=1,
        eval_count=1,
        eval_duration=1,
    )
    assert list(json.loads(line.to_json())) == [
        "model",
        "created_at",
        "message",
        "done",
        "done_reason",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ]
    piece = GenerateChunk(model="m", created_at="t", response="a", done=False)
    assert json.loads(piece.to_json()) == {"model": "m", "created_at": "t", "response": "a", "done": False}


@pytest.mark.parametrize(
    ("think", "switch", "budget"),
    [
        (None, None, None),  # the model's default
        (True, True, None),
        (False, False, None),
        ("low", True, 512),  # an effort: on, within its budget (docs/reasoning.md)
        ("medium", True, 2048),
        ("high", True, None),  # the model's own budget
    ],
)
def test_think_maps_to_the_chat_bodys_thinking(
    think: bool | str | None, switch: bool | None, budget: int | None
) -> None:
    for body in (
        chat(think=think).to_openai("m"),
        GenerateRequest(model="m", prompt="hi", think=think).to_openai("m"),
    ):
        assert isinstance(body, ChatCompletionRequest)
        assert body.thinking()[:2] == (switch, budget)
    assert chat(think=think).thinks() == (switch is True)


def test_think_level_outside_ollamas_is_a_400() -> None:
    with pytest.raises(ValidationError):
        chat(think="max")


def test_thinking_beside_the_answer_and_only_when_there() -> None:
    plain = MessageOut(content="4")
    assert json.loads(plain.to_json()) == {"role": "assistant", "content": "4"}
    thought = MessageOut(content="4", thinking="2+2")
    assert list(json.loads(thought.to_json())) == ["role", "content", "thinking"]
    piece = GenerateChunk(model="m", created_at="t", response="", thinking="hm", done=False)
    assert json.loads(piece.to_json()) == {
        "model": "m",
        "created_at": "t",
        "response": "",
        "thinking": "hm",
        "done": False,
    }
