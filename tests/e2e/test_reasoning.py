"""Reasoning models on the real llama.cpp engine and a real reasoning chat template: `tiny-reasoner`
(tests/support/reasoning.py) deployed beside the default models. The chat tests both engines share
(the split, budgets, constraints after the thinking) are in tests/support/suites/reasoning.py;
here are the rest (the other APIs, the clients).

Its template opens `<think>` in the prompt, so every answer begins in thinking whatever the model
writes; the tests end the thinking with a budget (the engine forces `</think>`), and hold the
model to a few tokens with `min_tokens`, so they assert what the feature guarantees (the split,
the counts, the constraint after the thinking), never what a 135M model happens to write.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import anthropic.types
import httpx
import openai
import pytest

from tests.support.gateway import GatewayProcess
from tests.support.openapi import validate
from tests.support.reasoning import MODEL
from tests.support.suites.reasoning import (  # noqa: F401
    BUDGET,
    QUESTION,
    ask,
    test_a_small_budget_leaves_room_for_an_answer,
    test_ending_the_turn_while_thinking_gives_the_end_marker,
    test_forced_tool_call_after_the_thinking,
    test_harmony_channels_split_stream_and_not,
    test_harmony_end_of_turn_while_thinking_opens_the_final_channel,
    test_harmony_json_schema_after_the_thinking,
    test_harmony_thinking_cannot_be_turned_off,
    test_include_reasoning_false_hides_the_thinking,
    test_json_schema_applies_after_the_thinking,
    test_no_end_marker_before_max_tokens_is_all_thinking,
    test_stream_carries_the_same_split,
    test_thinking_off,
    test_thinking_split_from_the_answer,
)
from tests.support.suites.responses import sse_events


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


def test_unknown_effort_is_a_400(client: openai.OpenAI, reasoner: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, reasoning_effort="extreme")
    assert info.value.body["param"] == "reasoning_effort"  # type: ignore[index]


# -- Anthropic Messages -------------------------------------------------------------------------


def _anthropic(client: anthropic.Anthropic, **fields: Any) -> Any:
    body = {
        "model": MODEL,
        "max_tokens": 16,
        "temperature": 0.0,
        "messages": QUESTION,
        "thinking": {"type": "enabled", "budget_tokens": 4},
        **fields,
    }
    return client.post("/v1/messages", cast_to=anthropic.types.Message, body=body)


def test_anthropic_thinking_block_is_signed_and_verified(
    client: openai.OpenAI, anthropic_client: anthropic.Anthropic, reasoner: str
) -> None:
    message = _anthropic(anthropic_client)
    chat = ask(client, min_tokens=0).parse().choices[0].message
    first = message.content[0]
    assert first.type == "thinking" and first.signature
    assert first.thinking == chat.reasoning_content  # type: ignore[attr-defined]
    assert [b.text for b in message.content if b.type == "text"] == (
        [chat.content] if chat.content.strip() else []
    )
    # Sent back unchanged it is accepted; edited, it is a 400 naming the block.
    turn = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}
    follow = [*QUESTION, turn, {"role": "user", "content": "And 3+3?"}]
    assert _anthropic(anthropic_client, messages=follow).content
    turn["content"][0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError) as info:
        _anthropic(anthropic_client, messages=follow)
    assert "signature" in str(info.value)
    turn["content"][0]["signature"] = "sïgnature"  # non-ASCII: once a 500 (found by the fuzz)
    with pytest.raises(anthropic.BadRequestError) as info:
        _anthropic(anthropic_client, messages=follow)
    assert "signature" in str(info.value)


def test_anthropic_stream_thinking_deltas(anthropic_client: anthropic.Anthropic, reasoner: str) -> None:
    whole = _anthropic(anthropic_client)
    thought, signature, kinds = "", "", []
    with anthropic_client.messages.stream(
        model=MODEL,
        max_tokens=16,
        messages=QUESTION,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 4},
        extra_body={"temperature": 0.0},  # this SDK's `stream()` has no `temperature`
    ) as stream:
        for ev in stream:
            if ev.type == "content_block_start":
                kinds.append(ev.content_block.type)
            if ev.type == "content_block_delta" and ev.delta.type == "thinking_delta":
                thought += ev.delta.thinking
            if ev.type == "content_block_delta" and ev.delta.type == "signature_delta":
                signature = ev.delta.signature
        final = stream.get_final_message()
    assert kinds[0] == "thinking"
    assert thought == whole.content[0].thinking and signature == whole.content[0].signature
    assert final.content[0].type == "thinking" and final.content[0].signature == signature


def test_anthropic_thinking_disabled_or_absent(anthropic_client: anthropic.Anthropic, reasoner: str) -> None:
    for fields in ({"thinking": {"type": "disabled"}}, {"thinking": None}):
        message = _anthropic(anthropic_client, **fields)
        assert all(b.type != "thinking" for b in message.content)


def test_anthropic_budget_must_be_below_max_tokens(
    anthropic_client: anthropic.Anthropic, reasoner: str
) -> None:
    with pytest.raises(anthropic.BadRequestError):
        _anthropic(anthropic_client, thinking={"type": "enabled", "budget_tokens": 16})


# -- Responses API ------------------------------------------------------------------------------


def _respond(base_url: str, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "input": "What is 2+2?", "max_output_tokens": 16, "temperature": 0.0, **fields}
    r = httpx.post(f"{base_url}/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    validate(data, "Response")
    return data


def test_responses_reasoning_item_streamed_stored_and_replayed(
    client: openai.OpenAI, base_url: str, reasoner: str
) -> None:
    whole = _respond(base_url, reasoning={"effort": "minimal"})
    chat = ask(client, min_tokens=0, thinking_token_budget=128).parse().choices[0].message
    first = whole["output"][0]
    assert first["type"] == "reasoning" and first["summary"] == []
    assert first["content"] == [{"type": "reasoning_text", "text": chat.reasoning_content}]  # type: ignore[attr-defined]
    assert whole["output"][1]["type"] == "message"
    usage = whole["usage"]
    assert 1 <= usage["output_tokens_details"]["reasoning_tokens"] <= usage["output_tokens"]
    assert whole["reasoning"]["effort"] == "minimal"

    events = sse_events(
        base_url,
        {
            "model": MODEL,
            "input": "What is 2+2?",
            "max_output_tokens": 16,
            "temperature": 0.0,
            "reasoning": {"effort": "minimal"},
        },
    )
    for i, (name, data) in enumerate(events):
        assert data["type"] == name and data["sequence_number"] == i
        validate(data, "ResponseStreamEvent")
    names = [n for n, _ in events]
    deltas = "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta")
    done = [d["text"] for n, d in events if n == "response.reasoning_text.done"]
    assert names.index("response.reasoning_text.delta") < names.index("response.output_text.done")
    assert done == [deltas] == [chat.reasoning_content]  # type: ignore[attr-defined]

    # Stored: the next turn continues it (its reasoning item is kept, not shown to the model).
    follow = _respond(base_url, previous_response_id=whole["id"], input="And 3+3?")
    assert follow["previous_response_id"] == whole["id"]
    # A client managing the conversation itself sends the reasoning item back as input.
    again = _respond(base_url, input=[*QUESTION, first, {"role": "user", "content": "And 3+3?"}])
    assert again["output"]


def test_responses_summary_when_asked(client: openai.OpenAI, base_url: str, reasoner: str) -> None:
    """`reasoning.summary` asked (through the openai SDK): the item's summary holds the thinking
    (no summariser model on a local server), streamed as OpenAI's summary events."""
    asked = {
        "model": MODEL,
        "input": "What is 2+2?",
        "max_output_tokens": 16,
        "temperature": 0.0,
        "reasoning": {"effort": "minimal", "summary": "auto"},
    }
    raw = client.responses.with_raw_response.create(**asked)  # type: ignore[call-overload]
    validate(json.loads(raw.text), "Response")
    response = raw.parse()
    first = response.output[0]
    assert first.type == "reasoning" and first.content
    assert [part.text for part in first.summary] == [first.content[0].text] and first.summary[0].text
    assert response.reasoning.summary == "auto"  # type: ignore[union-attr]

    events = sse_events(base_url, asked)
    for _, data in events:
        validate(data, "ResponseStreamEvent")
    names = [n for n, _ in events]
    deltas = "".join(d["delta"] for n, d in events if n == "response.reasoning_summary_text.delta")
    done = [d["text"] for n, d in events if n == "response.reasoning_summary_text.done"]
    assert done == [deltas] == [first.summary[0].text]
    assert names.index("response.reasoning_summary_part.added") < names.index(
        "response.reasoning_summary_part.done"
    )
    final = events[-1][1]["response"]["output"][0]
    assert final["summary"] == [{"type": "summary_text", "text": deltas}]

    with pytest.raises(openai.BadRequestError):
        client.responses.create(**{**asked, "reasoning": {"summary": "verbose"}})  # type: ignore[call-overload]


def test_responses_effort_none_turns_thinking_off(base_url: str, reasoner: str) -> None:
    data = _respond(base_url, reasoning={"effort": "none"})
    assert all(item["type"] != "reasoning" for item in data["output"])
    assert data["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


# -- openai-agents ------------------------------------------------------------------------------


async def test_agents_runner_gets_the_answer_without_the_thinking(base_url: str, reasoner: str) -> None:
    import agents
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner

    agents.set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        agent = Agent(
            name="reasoner",
            instructions="Answer briefly.",
            model=OpenAIChatCompletionsModel(model=MODEL, openai_client=c),
            model_settings=ModelSettings(temperature=0.0, max_tokens=16, extra_body=BUDGET),
        )
        result = await Runner.run(agent, "What is 2+2?")
    assert isinstance(result.final_output, str) and result.final_output
    assert "think>" not in result.final_output
    usage = result.context_wrapper.usage
    assert usage.output_tokens_details.reasoning_tokens == 5


def test_anthropic_count_tokens_counts_what_a_create_sees(
    anthropic_client: anthropic.Anthropic, reasoner: str
) -> None:
    """Thinking off (left out) closes it in the prompt; enabled leaves it open: the count follows."""
    for thinking in (None, {"type": "enabled", "budget_tokens": 4}):
        extra = {"thinking": thinking} if thinking else {}
        counted = anthropic_client.messages.count_tokens(model=MODEL, messages=QUESTION, **extra)  # type: ignore[arg-type]
        created = _anthropic(anthropic_client, thinking=thinking)
        assert counted.input_tokens == created.usage.input_tokens + (
            created.usage.cache_read_input_tokens or 0
        )
