"""`response_format`: the output parses as JSON and validates against the requested schema,
because the engine decodes under a grammar made from it (a tiny model cannot be trusted to):
a GBNF grammar on llama.cpp, guided decoding on vLLM (tests/e2e/test_structured_output.py runs
these on the default gateway, tests/e2e/vllm/test_vllm_openai_suite.py on vLLM).

Nothing here depends on where a tiny model's greedy text happens to end on this CPU (another
CPU's numbers give other text): a schema whose every string and array is bounded gets a
`max_tokens` above the longest text it allows, so the answer must end by itself and validate;
an open `json_object` answer must be an object, or the beginning of one when cut off
(tests/support/structured.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate
from tests.support.structured import PERSON, PERSON_MAX_TOKENS, check_json_object, max_json_bytes

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
                "max_tokens": PERSON_MAX_TOKENS,
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
        max_tokens=PERSON_MAX_TOKENS,
        temperature=0,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object(client: openai.OpenAI) -> None:
    """`json_object` bounds nothing: whether the model closes its object within `max_tokens` is
    the model's business (SmolLM2 on one CPU writes `{"answer": "The answer is: The answer is:
    ...` to the end). The answer is an object, or the beginning of one, on every machine; a
    short budget shows the cut-off case, and several seeds the rest."""
    ask: Any = [{"role": "user", "content": "Give me a JSON object with a key 'answer'."}]
    fmt: Any = {"type": "json_object"}
    short = client.chat.completions.create(
        model=CHAT_MODEL, messages=ask, max_tokens=6, temperature=0, response_format=fmt
    )
    choice = short.choices[0]
    check_json_object(choice.message.content, choice.finish_reason)
    if choice.finish_reason == "length":
        assert short.usage is not None and short.usage.completion_tokens == 6
    for kw in ({"temperature": 0}, *({"temperature": 1.0, "seed": s} for s in range(3))):
        out = client.chat.completions.create(
            model=CHAT_MODEL, messages=ask, max_tokens=100, response_format=fmt, **kw
        )
        check_json_object(out.choices[0].message.content, out.choices[0].finish_reason)


def test_sdk_parse_with_pydantic_model(client: openai.OpenAI) -> None:
    """The openai SDK's own structured-output helper sends a strict json_schema and parses it."""
    from openai.lib._pydantic import to_strict_json_schema
    from pydantic import BaseModel, Field

    class City(BaseModel):  # bounded strings: the answer ends (and parses) on any machine
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)
        population: int

    out = client.beta.chat.completions.parse(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Tell me about Paris."}],
        response_format=City,
        max_tokens=max_json_bytes(to_strict_json_schema(City)),
        temperature=0,
    )
    assert out.choices[0].finish_reason == "stop"
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
