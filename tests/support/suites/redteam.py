"""The red team's schema and Unicode findings (issue #12), a suite every backend passes: the limits
live in protocol/, so no engine's grammar compiler or tokenizer sees what it could not take, every
backend answers the same 400s, and every replica is the same process afterwards. Run on the
default (llama.cpp) gateway by tests/e2e/test_redteam.py and on vLLM by
tests/e2e/vllm/test_vllm_redteam.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bench.servers import Server as GatewayProcess
from raygate.protocol import schema_limits as limits
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.redteam import (
    SCHEMA_CASES,
    SCHEMA_PLACES,
    UNICODE_CASES,
    assert_openai_error,
    post_json,
    replica_pids,
    schema_body,
)

# -- 1, 2: grammar crash and memory bomb --------------------------------------------------------


@pytest.mark.parametrize("place", SCHEMA_PLACES)
@pytest.mark.parametrize(("case", "schema", "fragments"), SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_over_a_limit_is_400_and_every_replica_survives(
    gateway: GatewayProcess, place: str, case: str, schema: dict[str, Any], fragments: list[str]
) -> None:
    before = replica_pids(CHAT_MODEL)
    body, param = schema_body(place, schema)
    r = post_json(f"{gateway.url}/v1/chat/completions", body)
    assert_openai_error(r, 400, *fragments, param=param)
    assert replica_pids(CHAT_MODEL) == before
    assert len(r.content) < 4000  # the schema is never echoed


def test_tools_over_the_per_request_totals_are_400(gateway: GatewayProcess) -> None:
    """Each tool within the limits, all of them together over them; and more tools than OpenAI's 128."""
    before = replica_pids(CHAT_MODEL)
    array = {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer"}, "maxItems": 1000}},
    }
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": array}} for i in range(11)]
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "tool_choice": "required",
    }
    assert_openai_error(
        post_json(f"{gateway.url}/v1/chat/completions", body),
        400,
        "in all",
        str(limits.MAX_REPEAT_TOTAL),
        param="tools",
    )
    many = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": many}
    assert_openai_error(post_json(f"{gateway.url}/v1/chat/completions", body), 400, "128", param="tools")
    assert replica_pids(CHAT_MODEL) == before


@pytest.mark.parametrize("place", ["response_format", "tool_required"])
def test_schema_at_the_limits_is_served(gateway: GatewayProcess, place: str) -> None:
    """The limits refuse what breaks a replica, not what a real schema asks for."""
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string", "maxLength": limits.MAX_REPEAT},
            "code": {"type": "string", "pattern": "^[A-Z]{2,8}$"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 10},
        },
        "required": ["s"],
    }
    before = replica_pids(CHAT_MODEL)
    body, _ = schema_body(place, schema)
    r = post_json(f"{gateway.url}/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls")
    assert replica_pids(CHAT_MODEL) == before


def test_deeply_nested_json_is_400(gateway: GatewayProcess) -> None:
    """Nesting beyond what a parser's recursion takes: in a schema, and anywhere in a body."""
    body, _ = schema_body("response_format", {"type": "object"})
    headers = {"Content-Type": "application/json"}
    for depth in (100, 2000):  # written by hand: json.dumps itself stops at about 1,000 levels
        deep = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
        text = json.dumps(body).replace('{"type": "object"}', deep)
        r = httpx.post(f"{gateway.url}/v1/chat/completions", content=text, headers=headers, timeout=60)
        assert_openai_error(r, 400, param="response_format" if depth == 100 else None)
    text = json.dumps(body)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(f"{gateway.url}/v1/chat/completions", content=text, headers=headers, timeout=60)
    assert_openai_error(r, 400)


# -- 3: invalid Unicode ---------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "path", "body", "param"), UNICODE_CASES, ids=[c[0] for c in UNICODE_CASES])
def test_lone_surrogate_is_400_naming_the_field(
    gateway: GatewayProcess, case: str, path: str, body: dict[str, Any], param: str
) -> None:
    before = replica_pids(CHAT_MODEL, EMBED_MODEL)
    r = post_json(f"{gateway.url}{path}", body)
    err = assert_openai_error(r, 400, "lone surrogate", param=param)
    assert "U+D" in err["message"]
    assert replica_pids(CHAT_MODEL, EMBED_MODEL) == before


def test_surrogate_pairs_and_odd_unknown_fields_are_not_refused(gateway: GatewayProcess) -> None:
    """The check refuses what cannot be encoded, not non-BMP characters written as pairs."""
    emoji = "Rate this: \U0001f600"  # json.dumps writes it as the pair "\ud83d\ude00"
    chat = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": emoji}], "max_tokens": 2}
    assert post_json(f"{gateway.url}/v1/chat/completions", chat).status_code == 200
    embed = {"model": EMBED_MODEL, "input": [emoji, "plain"]}
    assert len(post_json(f"{gateway.url}/v1/embeddings", embed).json()["data"]) == 2
    tokens = post_json(f"{gateway.url}/tokenize", {"model": CHAT_MODEL, "prompt": emoji})
    assert tokens.status_code == 200 and tokens.json()["count"] > 0
    # A lone surrogate in an unknown field's *name* cannot even be read: a 400, not a 500.
    odd = {**chat, "x\ud800": 1}
    assert_openai_error(post_json(f"{gateway.url}/v1/chat/completions", odd), 400)
