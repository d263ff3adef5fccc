"""Tools through the openai SDK: forced calls really happen (the output is grammar-constrained),
calls stream with `index` on every piece, and follow-up turns render through the template.

Every tool's parameters bound their strings, so one call has a longest text (`CALL_TOKENS`); with
that budget a single forced call must end (`tool_calls`) on any machine, whatever the model
writes into it. Parallel calls have no such bound: the model may keep calling until
`max_tokens`, and then only the calls it finished are promised."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate
from tests.support.tools import CALL_TOKENS, PARAMS, TIME_PARAMS, TOOLS

ASK: list[Any] = [{"role": "user", "content": "What is the weather like in Paris?"}]


def post(base_url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/chat/completions", json={"model": CHAT_MODEL, **body}, timeout=120)


def check_calls(
    message: dict[str, Any], names: set[str], content: bool = False, finished: bool = True
) -> list[dict[str, Any]]:
    """`content`: text before the call is allowed (only when the model chose to call).
    `finished=False`: `max_tokens` cut the answer off, so the last call may be unfinished."""
    calls = message["tool_calls"]
    assert calls and (content or message["content"] is None)
    for i, call in enumerate(calls):
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] in names
        if finished or i < len(calls) - 1:
            jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS[call["function"]["name"]])
    assert len({c["id"] for c in calls}) == len(calls)
    return list(calls)


def test_required_forces_a_call(base_url: str) -> None:
    r = post(
        base_url,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=CALL_TOKENS,
        temperature=0,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, "CreateChatCompletionResponse")
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert len(check_calls(body["choices"][0]["message"], {"get_weather", "get_time"})) == 1


def test_required_parallel_calls_are_each_valid(base_url: str) -> None:
    """Parallel calls allowed (the default): one call or more, every finished one valid. The
    first always finishes within the budget; the model may go on calling until `max_tokens`."""
    r = post(
        base_url,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=CALL_TOKENS + 20,
        temperature=0,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, "CreateChatCompletionResponse")
    finish = body["choices"][0]["finish_reason"]
    assert finish in ("tool_calls", "length")
    names = {"get_weather", "get_time"}
    calls = check_calls(body["choices"][0]["message"], names, finished=finish == "tool_calls")
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), PARAMS[calls[0]["function"]["name"]])


def test_named_choice_forces_that_function(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        max_tokens=CALL_TOKENS,
        n=2,
        seed=11,
    )
    assert len(out.choices) == 2
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), TIME_PARAMS)


def auto_answer(base_url: str, content: str, **sampling: Any) -> str:
    """One `auto` answer, checked, and what it was: "call" (one finished, valid call), "cut"
    (`max_tokens` ended it inside a call) or "text" (no call; then never the opening tag, since
    once the model writes it the grammar takes over)."""
    messages = [{"role": "user", "content": content}]
    body = post(
        base_url,
        messages=messages,
        tools=TOOLS,
        tool_choice="auto",
        parallel_tool_calls=False,
        max_tokens=12 + CALL_TOKENS,
        **sampling,  # some text, then a whole call
    ).json()
    validate(body, "CreateChatCompletionResponse")
    choice = body["choices"][0]
    if "tool_calls" in choice["message"]:
        finished = choice["finish_reason"] == "tool_calls"
        assert finished or choice["finish_reason"] == "length", choice
        calls = check_calls(choice["message"], {"get_weather", "get_time"}, content=True, finished=finished)
        assert len(calls) == 1
        return "call" if finished else "cut"
    assert choice["finish_reason"] in ("stop", "length")
    assert "<tool_call>" not in (choice["message"]["content"] or "")
    return "text"


def test_auto_lets_the_model_choose(base_url: str) -> None:
    """The model decides, so which way one answer goes depends on the CPU's numbers; that both
    ways happen does not. The tiny model copies text it is asked to repeat (and once it writes
    the opening tag the grammar makes the rest a valid call), and answers a greeting in text:
    among its greedy answer and a few seeded samples of each, both outcomes appear."""
    # The plain model (`repetition_penalty` off): the default config's penalty covers the prompt,
    # which is what stops the copying this test relies on.
    plain = {"repetition_penalty": 1.0}
    tries: list[dict[str, Any]] = [
        {"temperature": 0, **plain},
        *({"temperature": 1.0, "seed": s, **plain} for s in range(7)),
    ]
    for content, wanted in (("Repeat after me: 'Hello <tool_call>'", "call"), ("Say hello.", "text")):
        kinds = []
        for sampling in tries:
            kinds.append(auto_answer(base_url, content, **sampling))
            if kinds[-1] == wanted:
                break
        assert kinds[-1] == wanted, (content, kinds)


def test_none_never_calls(base_url: str) -> None:
    echo = [{"role": "user", "content": "Repeat after me: 'Hello <tool_call>'"}]
    body = post(base_url, messages=echo, tools=TOOLS, tool_choice="none", max_tokens=40, temperature=0).json()
    assert "tool_calls" not in body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_streamed_calls_carry_index_on_every_piece(client: openai.OpenAI, base_url: str) -> None:
    with httpx.stream(
        "POST",
        f"{base_url}/chat/completions",
        json={
            "model": CHAT_MODEL,
            "messages": ASK,
            "tools": TOOLS,
            "tool_choice": "required",
            "max_tokens": CALL_TOKENS,
            "stream": True,
        },
        timeout=120,
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    pieces = []
    for c in chunks:
        validate(c, "CreateChatCompletionStreamResponse")
        for choice in c["choices"]:
            pieces += choice["delta"].get("tool_calls", [])
    assert pieces and all("index" in p for p in pieces)
    first = pieces[0]
    assert first["id"].startswith("call_") and first["type"] == "function" and first["function"]["name"]
    assert all("id" not in p for p in pieces[1:] if p["index"] == first["index"])
    assert len(pieces) > 2, "arguments should stream in several pieces"
    # The first call always finishes within the budget (later parallel calls may be cut off).
    arguments = "".join(p["function"].get("arguments", "") for p in pieces if p["index"] == 0)
    jsonschema.validate(json.loads(arguments), PARAMS[first["function"]["name"]])
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes in (["tool_calls"], ["length"])

    # The SDK's own stream accumulator (what LangChain and agents use) reassembles the call.
    with client.beta.chat.completions.stream(
        model=CHAT_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=CALL_TOKENS,
        temperature=0,
    ) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_follow_up_turn_with_tool_results(client: openai.OpenAI, base_url: str) -> None:
    first = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=CALL_TOKENS,
    )
    assert first.choices[0].message.tool_calls and len(first.choices[0].message.tool_calls) == 1
    call = first.choices[0].message.tool_calls[0]
    history: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    out = client.chat.completions.create(
        model=CHAT_MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=20
    )
    assert out.choices[0].message.content and out.choices[0].message.tool_calls is None
    # What the model saw: the earlier call and the tool's answer, rendered by its chat template.
    tok = httpx.post(
        f"{base_url.removesuffix('/v1')}/tokenize",
        json={"model": CHAT_MODEL, "messages": history, "return_token_strs": True},
        timeout=60,
    ).json()
    rendered = "".join(tok["token_strs"])
    assert f'"name": "{call.function.name}"' in rendered
    assert "<tool_response>\n18 degrees and sunny\n</tool_response>" in rendered


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
    ],
)
def test_bad_tool_requests_are_400(base_url: str, extra: dict[str, Any], param: str) -> None:
    r = post(base_url, messages=ASK, max_tokens=2, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tool_message_needs_its_call_id(base_url: str) -> None:
    r = post(base_url, messages=[*ASK, {"role": "tool", "content": "x"}], max_tokens=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].tool_call_id"
