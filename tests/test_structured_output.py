"""`response_format`: the output parses as JSON and validates against the requested schema,
because the engine decodes under a grammar made from it (a tiny model cannot be trusted to):
a GBNF grammar on llama.cpp, guided decoding on vLLM (tests/vllm_backend reruns these)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import CHAT_MODEL
from tests.support.openapi import validate

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "mood": {"type": "string", "enum": ["happy", "sad"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "mood", "tags"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person called Ada as JSON."}]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_validates(client: openai.OpenAI, base_url: str, temperature: float) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(2 if temperature else 1):
        raw = httpx.post(
            f"{base_url}/chat/completions",
            json={
                "model": CHAT_MODEL,
                "messages": ASK,
                "max_tokens": 120,
                "temperature": temperature,
                "seed": seed,
                "response_format": fmt,
            },
            timeout=120,
        )
        assert raw.status_code == 200, raw.text
        body = raw.json()
        validate(body, "CreateChatCompletionResponse")
        assert body["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), PERSON)


def test_json_schema_streamed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=120,
        temperature=0,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Give me a JSON object with a key 'answer'."}],
        max_tokens=100,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_sdk_parse_with_pydantic_model(client: openai.OpenAI) -> None:
    """The openai SDK's own structured-output helper sends a strict json_schema and parses it."""
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str
        population: int

    out = client.beta.chat.completions.parse(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Tell me about Paris."}],
        response_format=City,
        max_tokens=80,
        temperature=0,
    )
    parsed = out.choices[0].message.parsed
    assert isinstance(parsed, City) and isinstance(parsed.population, int)


def test_bad_formats_are_400(base_url: str, backend: str) -> None:
    def post(fmt: object, **extra: object) -> httpx.Response:
        return httpx.post(
            f"{base_url}/chat/completions",
            json={"model": CHAT_MODEL, "messages": ASK, "response_format": fmt, **extra},
            timeout=60,
        )

    for fmt in ({"type": "xml"}, {"type": "json_schema"}, "json"):
        r = post(fmt)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    r = post(
        {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(unclosed"}},
        }
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = post({"type": "json_object"}, tools=[tool])
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "response_format" and backend in err["message"]
    assert post({"type": "text"}, max_tokens=2).status_code == 200
