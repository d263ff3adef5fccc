"""A reasoning model's chat completions on either engine: `tiny-reasoner` (tests/support/reasoning.py)
split into thinking and answer, stream and not, switched off, and bounded by a thinking budget
that the engine enforces by writing the end marker itself. Run by tests/e2e/test_reasoning.py
(llama.cpp) and tests/e2e/vllm/test_vllm_reasoning.py (vLLM), each with its own `reasoner`
deployment and a `client` for the gateway that serves it.

The model's template opens `<think>` in the prompt, so every answer begins in thinking whatever
the model writes; the budget ends it, and `min_tokens` holds the model to a few tokens more, so
the tests assert what the feature guarantees (the split, the counts), never what a 135M model
happens to write.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.support.openapi import validate
from tests.support.reasoning import EOS, HARMONY_END_TOKENS, HARMONY_MODEL, MODEL
from tests.support.tools import TOOLS

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
# Thinking for 4 tokens, then the forced end marker, then at least 3 answer tokens.
BUDGET = {"thinking_token_budget": 4, "min_tokens": 8}
YES_NO = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": YES_NO}}


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


@pytest.mark.parametrize("budget", [0, 1])
def test_a_small_budget_leaves_room_for_an_answer(client: openai.OpenAI, reasoner: str, budget: int) -> None:
    body = json.loads(ask(client, max_tokens=6, thinking_token_budget=budget, min_tokens=6).text)
    message = body["choices"][0]["message"]
    assert message["content"]
    # `budget` thinking tokens, then the forced end marker.
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == budget + 1


def test_include_reasoning_false_hides_the_thinking(client: openai.OpenAI, reasoner: str) -> None:
    body = json.loads(ask(client, include_reasoning=False).text)
    message = body["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


# -- constraints apply to the answer: the grammar starts after the end marker ---------------------


def test_json_schema_applies_after_the_thinking(client: openai.OpenAI, reasoner: str) -> None:
    body = json.loads(ask(client, max_tokens=40, response_format=JSON_FORMAT, min_tokens=0).text)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"], "the thinking stayed on under the grammar"
    assert json.loads(message["content"]) in ({"answer": "yes"}, {"answer": "no"})
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 5


def test_forced_tool_call_after_the_thinking(client: openai.OpenAI, reasoner: str) -> None:
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
    assert choice["message"]["reasoning_content"], "the thinking stayed on under the grammar"
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] in {t["function"]["name"] for t in TOOLS}
    json.loads(call["function"]["arguments"])
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 5


def test_ending_the_turn_while_thinking_gives_the_end_marker(client: openai.OpenAI, reasoner: str) -> None:
    """The end of the turn pushed to the top (`logit_bias`) while the model thinks: the engine
    writes `</think>` instead, so the answer still comes, and here the grammar's answer."""
    body = json.loads(
        ask(
            client,
            max_tokens=40,
            response_format=JSON_FORMAT,
            logit_bias={str(EOS): 100},
            thinking_token_budget=None,
            min_tokens=0,
        ).text
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"]) in ({"answer": "yes"}, {"answer": "no"})
    # The end marker the engine wrote in place of the end of the turn (and no thinking before it).
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 1
    assert not choice["message"].get("reasoning_content")


# -- gpt-oss's harmony channels (`tiny-harmony`): the analysis channel is the thinking -------------

# Thinking for 4 tokens, the forced `<|end|><|start|>assistant<|channel|>final<|message|>`, then
# at least 4 answer tokens.
HARMONY_BUDGET = {"thinking_token_budget": 4, "min_tokens": 4 + HARMONY_END_TOKENS + 4}


def ask_harmony(client: openai.OpenAI, **fields: Any) -> Any:
    body = {"max_tokens": 24, "temperature": 0.0, **HARMONY_BUDGET, **fields}
    return client.chat.completions.with_raw_response.create(
        model=HARMONY_MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        extra_body=body,
    )


def _no_markers(*texts: str) -> None:
    for text in texts:
        for marker in ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>"):
            assert marker not in text


def test_harmony_channels_split_stream_and_not(client: openai.OpenAI, harmony: str) -> None:
    """The budget forces the whole final-channel sequence, then the answer comes; the analysis
    channel is the thinking, no marker reaches the client, and the stream carries the same split."""
    body = json.loads(ask_harmony(client).text)
    validate(body, "CreateChatCompletionResponse")
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]
    _no_markers(message["content"], message["reasoning_content"])
    usage = body["usage"]
    # The thinking and the forced final-channel header count as thinking, the rest as answer. Not
    # an exact count: a model that writes `<|end|>` or a header itself changes how the engines'
    # budgets count (vLLM matches the end sequence token by token).
    reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
    assert HARMONY_END_TOKENS < reasoning_tokens < usage["completion_tokens"]
    thought, answer = "", ""
    stream = client.chat.completions.create(
        model=HARMONY_MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0.0,
        stream=True,
        extra_body=HARMONY_BUDGET,
    )
    for chunk in stream:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            thought += extra.get("reasoning_content") or ""
            answer += choice.delta.content or ""
    assert (thought, answer) == (message["reasoning_content"], message["content"])


def test_harmony_thinking_cannot_be_turned_off(client: openai.OpenAI, harmony: str) -> None:
    """As vLLM's gpt-oss parser: `enable_thinking: false` is ignored (gpt-oss always thinks)."""
    body = json.loads(ask_harmony(client, chat_template_kwargs={"enable_thinking": False}).text)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]


def _harmony_json(client: openai.OpenAI, **fields: Any) -> None:
    body = json.loads(
        ask_harmony(client, max_tokens=48, response_format=JSON_FORMAT, min_tokens=0, **fields).text
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"]) in ({"answer": "yes"}, {"answer": "no"})
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= HARMONY_END_TOKENS


def test_harmony_json_schema_after_the_thinking(client: openai.OpenAI, harmony: str) -> None:
    """The grammar holds until the final channel starts (the budget forces its header): the
    thinking is free text, the answer the schema's JSON, then the end of the turn, which the
    grammar alone allows once its JSON is whole. (The end of turn is pushed down while thinking:
    vLLM's engine does not turn it into gpt-oss's multi-token end sequence, and `min_tokens` does
    not hold under a grammar.)"""
    _harmony_json(client, logit_bias={str(EOS): -100})


def test_harmony_end_of_turn_while_thinking_opens_the_final_channel(
    client: openai.OpenAI, harmony: str
) -> None:
    """An end of turn while thinking (pushed to the top by `logit_bias`) becomes the
    end-of-thinking sequence, then the grammar's answer (llama.cpp's sampler; vLLM's
    thinking_end.py turns it into one-token markers only)."""
    _harmony_json(client, logit_bias={str(EOS): 100}, thinking_token_budget=None)
