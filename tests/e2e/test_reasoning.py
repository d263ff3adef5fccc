"""Reasoning models on the real llama.cpp engine and a real reasoning chat template: `tiny-reasoner`
(tests/support/reasoning.py) deployed beside the default models.

Its template opens `<think>` in the prompt, so every answer begins in thinking whatever the model
writes; the tests end the thinking with a budget (the engine forces `</think>`), and hold the
model to a few tokens with `min_tokens`, so they assert what the feature guarantees (the split,
the counts, the constraint after the thinking), never what a 135M model happens to write.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.admin import deployed
from tests.support.gateway import GatewayProcess
from tests.support.openapi import validate
from tests.support.reasoning import MODEL, reasoner_spec
from tests.support.tools import TOOLS

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
# Thinking for 4 tokens, then the forced end marker, then at least 3 answer tokens.
BUDGET = {"thinking_token_budget": 4, "min_tokens": 8}


@pytest.fixture(scope="module")
def reasoner(gateway: GatewayProcess) -> Iterator[str]:
    with deployed(gateway.url, reasoner_spec()) as name:
        yield name


def ask(client: openai.OpenAI, messages: list[dict[str, Any]] = QUESTION, **fields: Any) -> Any:
    """A chat request with the budget above, `fields` over it (all in the body, as sent)."""
    body = {"max_tokens": 16, "temperature": 0.0, **BUDGET, **fields}
    return client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        extra_body=body,
    )


def test_thinking_split_from_the_answer(client: openai.OpenAI, reasoner: str) -> None:
    raw = ask(client)
    body = json.loads(raw.text)
    validate(body, "CreateChatCompletionResponse")
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and message["reasoning"] == message["reasoning_content"]
    assert message["content"]
    for text in (message["content"], message["reasoning_content"]):
        assert "<think>" not in text and "</think>" not in text
    usage = body["usage"]
    # 4 thinking tokens and the end marker the budget forced.
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 5
    assert usage["completion_tokens"] > 5


def test_stream_carries_the_same_split(client: openai.OpenAI, reasoner: str) -> None:
    whole = ask(client).parse().choices[0].message
    thought, answer, reasoning_tokens = "", "", None
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=BUDGET,
    )
    for chunk in stream:
        validate(chunk.model_dump(mode="json", exclude_unset=True), "CreateChatCompletionStreamResponse")
        if chunk.usage is not None:
            reasoning_tokens = chunk.usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning") == extra.get("reasoning_content")
            thought += extra.get("reasoning_content") or ""
            answer += choice.delta.content or ""
    assert thought == whole.reasoning_content  # type: ignore[attr-defined]
    assert answer == whole.content
    assert reasoning_tokens == 5


@pytest.mark.parametrize(
    "switch",
    [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}],
    ids=["enable_thinking", "reasoning_effort"],
)
def test_thinking_off(client: openai.OpenAI, reasoner: str, switch: dict[str, Any]) -> None:
    body = json.loads(ask(client, min_tokens=3, **switch).text)
    message = body["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_no_end_marker_before_max_tokens_is_all_thinking(client: openai.OpenAI, reasoner: str) -> None:
    body = json.loads(ask(client, max_tokens=6, thinking_token_budget=None, min_tokens=6).text)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["reasoning_content"] and not choice["message"]["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6


def test_a_small_budget_leaves_room_for_an_answer(client: openai.OpenAI, reasoner: str) -> None:
    body = json.loads(ask(client, max_tokens=6, thinking_token_budget=1, min_tokens=6).text)
    message = body["choices"][0]["message"]
    assert message["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2


def test_include_reasoning_false_hides_the_thinking(client: openai.OpenAI, reasoner: str) -> None:
    body = json.loads(ask(client, include_reasoning=False).text)
    message = body["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


def test_json_schema_applies_after_the_thinking(client: openai.OpenAI, reasoner: str) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    body = json.loads(
        ask(
            client,
            max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
            min_tokens=0,
        ).text
    )
    choice = body["choices"][0]
    assert json.loads(choice["message"]["content"]) in ({"answer": "yes"}, {"answer": "no"})
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 1


def test_tool_call_after_the_thinking(client: openai.OpenAI, reasoner: str) -> None:
    body = json.loads(
        ask(
            client,
            max_tokens=120,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=TOOLS,
            tool_choice="required",
            min_tokens=0,
        ).text
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] in {t["function"]["name"] for t in TOOLS}
    json.loads(call["function"]["arguments"])
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 1


def test_a_model_without_a_reasoning_block_is_unchanged(
    client: openai.OpenAI, gateway: GatewayProcess
) -> None:
    body = client.chat.completions.with_raw_response.create(
        model="smollm2-135m-instruct",
        messages=QUESTION,
        max_tokens=4,
        temperature=0.0,  # type: ignore[arg-type]
    )
    data = json.loads(body.text)
    assert "reasoning_content" not in data["choices"][0]["message"]
    assert "completion_tokens_details" not in data["usage"]


def test_langchain_sees_the_answer_only(base_url: str, reasoner: str, langchain_http: dict[str, Any]) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL,
        base_url=base_url,
        api_key="unused",  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0.0,
        extra_body=BUDGET,
        **langchain_http,
    )
    reply = llm.invoke("What is 2+2?")
    assert isinstance(reply.content, str) and reply.content
    assert "think>" not in reply.content
    details = reply.usage_metadata["output_token_details"]  # type: ignore[index]
    assert details["reasoning"] == 5
