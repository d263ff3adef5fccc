"""What the red-team tests send (issue #12), shared by the llama.cpp and vLLM runs: schemas over a
grammar limit, text with lone surrogates, and a way to tell that every replica survived."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import ray

from raygate.protocol import schema_limits as limits
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.replicas import replica_actors

LIMIT = str(limits.MAX_REPEAT)


def _nest(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


# (id, schema, fragments the 400's message must hold: the keyword and the limit)
SCHEMA_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    # The red team's crash: 30,000 nested optional groups overflow llama.cpp's parser stack.
    (
        "maxLength-30000",
        {"type": "object", "properties": {"s": {"type": "string", "maxLength": 30000}}},
        ["`maxLength`", "/properties/s", LIMIT],
    ),
    (
        "maxItems-30000",
        {"type": "array", "items": {"type": "integer"}, "maxItems": 30000},
        ["`maxItems`", LIMIT],
    ),
    # The red team's memory bomb: a flat sequence of 10^9 items.
    ("minLength-1e9", {"type": "string", "minLength": 1000000000}, ["`minLength`", LIMIT]),
    (
        "minItems-1e9",
        {"type": "array", "items": {"type": "string"}, "minItems": 1000000000},
        ["`minItems`", LIMIT],
    ),
    ("minLength-float", {"type": "string", "minLength": 1e9}, ["`minLength`", LIMIT]),
    ("maxProperties", {"type": "object", "maxProperties": 5000}, ["`maxProperties`", LIMIT]),
    ("pattern-range", {"type": "string", "pattern": "^a{0,30000}$"}, ["`pattern`", "{0,30000}", LIMIT]),
    ("pattern-exact", {"type": "string", "pattern": "^[a-z]{30000}$"}, ["`pattern`", LIMIT]),
    (
        "pattern-long",
        {"type": "string", "pattern": "^" + "ab" * 1000 + "$"},
        ["`pattern`", str(limits.MAX_PATTERN_CHARS)],
    ),
    (
        "pattern-groups",
        {"type": "string", "pattern": "^" + "(" * 40 + "a" + ")" * 40 + "$"},
        ["`pattern`", str(limits.MAX_PATTERN_GROUPS)],
    ),
    ("nesting", _nest(40), ["nests deeper", str(limits.MAX_DEPTH)]),
    (
        "properties",
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}},
        ["`properties`", str(limits.MAX_PROPERTIES)],
    ),
    ("enum", {"enum": [f"v{i}" for i in range(2000)]}, ["`enum`", str(limits.MAX_ENUM)]),
    ("size", {"type": "object", "description": "x" * 70000}, ["bytes", str(limits.MAX_SCHEMA_BYTES)]),
    # Each branch is within the limits; together they are a 1.6 MB grammar on llama.cpp.
    (
        "anyOf-total",
        {"anyOf": [{"type": "string", "maxLength": 1000, "description": str(i)} for i in range(11)]},
        ["in all", str(limits.MAX_REPEAT_TOTAL)],
    ),
    ("negative", {"type": "string", "maxLength": -1}, ["`maxLength`", "non-negative integer"]),
    ("min-above-max", {"type": "array", "minItems": 10, "maxItems": 5}, ["`minItems`", "`maxItems`"]),
]

# Where a schema goes: response_format, or a tool's parameters with each tool_choice that
# constrains (required / named) or may constrain (auto) the output with a grammar.
SCHEMA_PLACES = ["response_format", "tool_required", "tool_named", "tool_auto"]


def schema_body(place: str, schema: dict[str, Any], model: str = CHAT_MODEL) -> tuple[dict[str, Any], str]:
    """A chat body carrying `schema` at `place`, and the `param` its 400 must name."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Fill it in."}],
        "max_tokens": 8,
    }
    if place == "response_format":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
        return body, "response_format"
    body["tools"] = [
        {
            "type": "function",
            "function": {"name": "fill", "parameters": {"type": "object", "properties": {"x": schema}}},
        }
    ]
    body["tool_choice"] = {
        "required": "required",
        "auto": "auto",
        "named": {"type": "function", "function": {"name": "fill"}},
    }[place.removeprefix("tool_")]
    return body, "tools"


BAD = "a\ud800b"  # a lone high surrogate, as JSON's "\ud800" escape makes it
LOW = "\udc00x"  # a lone low surrogate


def _chat(**kw: Any) -> dict[str, Any]:
    return {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}


# (id, path, body, the `param` of the 400)
UNICODE_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("chat-content", "/v1/chat/completions", _chat(messages=[{"role": "user", "content": BAD}]), "messages"),
    (
        "chat-content-low",
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": LOW}]),
        "messages",
    ),
    (
        "chat-part",
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": [{"type": "text", "text": BAD}]}]),
        "messages",
    ),
    (
        "chat-system",
        "/v1/chat/completions",
        _chat(messages=[{"role": "system", "content": BAD}, {"role": "user", "content": "hi"}]),
        "messages",
    ),
    (
        "chat-name",
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": "hi", "name": BAD}]),
        "messages",
    ),
    ("chat-stop", "/v1/chat/completions", _chat(stop=["ok", BAD]), "stop"),
    ("chat-user", "/v1/chat/completions", _chat(user=BAD), "user"),
    (
        "chat-tool-arguments",
        "/v1/chat/completions",
        _chat(
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": "' + BAD + '"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
        ),
        "messages",
    ),
    (
        "chat-tool-description",
        "/v1/chat/completions",
        _chat(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "description": BAD, "parameters": {"type": "object"}},
                }
            ]
        ),
        "tools",
    ),
    (
        "chat-tool-property-name",
        "/v1/chat/completions",
        _chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {LOW: {"type": "string"}}},
                    },
                }
            ]
        ),
        "tools",
    ),
    (
        "chat-schema-enum",
        "/v1/chat/completions",
        _chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "e", "schema": {"enum": ["ok", BAD]}},
            }
        ),
        "response_format",
    ),
    ("chat-model", "/v1/chat/completions", _chat(model=BAD), "model"),
    (
        "completions-prompt",
        "/v1/completions",
        {"model": CHAT_MODEL, "prompt": BAD, "max_tokens": 2},
        "prompt",
    ),
    (
        "completions-prompts",
        "/v1/completions",
        {"model": CHAT_MODEL, "prompt": ["ok", BAD], "max_tokens": 2},
        "prompt",
    ),
    (
        "completions-stop",
        "/v1/completions",
        {"model": CHAT_MODEL, "prompt": "hi", "stop": BAD, "max_tokens": 2},
        "stop",
    ),
    (
        "completions-suffix",
        "/v1/completions",
        {"model": CHAT_MODEL, "prompt": "hi", "suffix": BAD, "max_tokens": 2},
        "suffix",
    ),
    ("embeddings-input", "/v1/embeddings", {"model": EMBED_MODEL, "input": BAD}, "input"),
    ("embeddings-inputs", "/v1/embeddings", {"model": EMBED_MODEL, "input": ["ok", LOW]}, "input"),
    ("tokenize-prompt", "/tokenize", {"model": CHAT_MODEL, "prompt": BAD}, "prompt"),
    (
        "tokenize-messages",
        "/tokenize",
        {"model": CHAT_MODEL, "messages": [{"role": "user", "content": BAD}]},
        "messages",
    ),
    ("tokenize-embed-model", "/tokenize", {"model": EMBED_MODEL, "prompt": LOW}, "prompt"),
]


def post_json(url: str, body: Any, **kw: Any) -> httpx.Response:
    """POST `body` as JSON text with every non-ASCII character escaped, the way a client writes a
    lone surrogate (`"\\ud800"`: the only way it can be in a JSON text at all)."""
    return httpx.post(
        url,
        content=json.dumps(body).encode("ascii"),
        headers={"Content-Type": "application/json"},
        timeout=120,
        **kw,
    )


def assert_openai_error(
    r: httpx.Response, status: int, *fragments: str, param: str | None = None
) -> dict[str, Any]:
    assert r.status_code == status, r.text[:2000]
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error", err
    for fragment in fragments:
        assert fragment in err["message"], (fragment, err)
    if param is not None:
        assert err["param"] == param, err
    return err


def replica_pids(*models: str) -> dict[str, int]:
    """Actor name -> process id of every replica of `models` (in every namespace): a replica that
    crashed and was replaced has a new name, a restarted process a new pid."""
    pids = {}
    for model in models:
        for actor in replica_actors(model):
            pid = int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))
            pids[f"{model}/{actor._actor_id.hex()}"] = pid
    assert pids, f"no replica of {models} found"
    return pids
