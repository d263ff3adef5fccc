"""The batched llama.cpp engine (`engine: {n_seq_max: N}`) behind the gateway: logprobs, echo
scoring, logit_bias, response_format and tools cross Ray and come out in OpenAI's shapes, with
several such requests decoded in one batch.

One replica with `n_seq_max: 4` is deployed on the shared gateway for this module through the
admin API (a few seconds, no extra gateway process); where the numbers must agree it is compared
with the default model, the one-sequence engine on the same GGUF. The engine-level tests in
tests/engine/test_llama_batched.py check the same against the engine directly.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.support.admin import chat_spec, deployed
from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL
from tests.support.structured import PERSON, PERSON_MAX_TOKENS
from tests.support.tools import CALL_TOKENS, PARAMS, TOOLS

BATCHED = "lc-batched"
# The one-sequence and the batched engine give the same numbers when a prompt is evaluated the
# same way. Here the batch's make-up depends on arrival times, and llama.cpp's numbers move with
# it, by up to ~0.1 nats on unlikely tokens (see tests/engine/test_llama_batched.py); a wrong logits row would
# be off by whole nats, with other tokens on top. The prompts are used nowhere else in the suite,
# so neither engine serves them from a cached prefix (which moves the numbers too).
TOL = 0.25
WEATHER_ASK: list[Any] = [{"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def batched(gateway: GatewayProcess) -> Iterator[str]:
    spec = chat_spec(BATCHED, engine={"n_ctx": 1024, "n_threads": 1, "n_seq_max": 4})
    with deployed(gateway.url, spec) as name:
        yield name


async def _chat_logprobs(c: openai.AsyncOpenAI, model: str) -> Any:
    out = await c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name a colour you like."}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"repetition_penalty": 1.0},  # pure greedy on both: the default model has a penalty
    )
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.content
    return out.choices[0].logprobs.content


async def _echo_scores(c: openai.AsyncOpenAI, model: str) -> Any:
    out = await c.completions.create(
        model=model,
        prompt="The capital of Italy is Rome",
        max_tokens=1,
        echo=True,
        logprobs=2,
        temperature=0,
    )
    assert out.choices[0].logprobs is not None
    return out.choices[0].logprobs


async def _json(c: openai.AsyncOpenAI, model: str) -> None:
    out = await c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person called Ada as JSON."}],
        max_tokens=PERSON_MAX_TOKENS,  # the schema's longest answer: it ends by itself
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), PERSON)


async def _required_call_streamed(c: openai.AsyncOpenAI, model: str) -> None:
    stream = await c.chat.completions.create(
        model=model,
        messages=WEATHER_ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=CALL_TOKENS,
        stream=True,
    )
    pieces, finishes = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            pieces += choice.delta.tool_calls or []
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert finishes == ["tool_calls"] and len(pieces) > 2
    first = pieces[0]
    assert first.id and first.function is not None and first.function.name in PARAMS
    arguments = "".join(p.function.arguments or "" for p in pieces if p.index == 0 and p.function)
    jsonschema.validate(json.loads(arguments), PARAMS[first.function.name])


async def _named_call(c: openai.AsyncOpenAI, model: str) -> None:
    out = await c.chat.completions.create(
        model=model,
        messages=WEATHER_ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        max_tokens=CALL_TOKENS,
        seed=11,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS["get_time"])


async def _forced_banana(c: openai.AsyncOpenAI, model: str, banana: int) -> None:
    out = await c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name a fruit."}],
        max_tokens=3,
        logit_bias={str(banana): 100},
        temperature=1.0,
        seed=1,
    )
    assert out.choices[0].message.content == " banana" * 3


async def test_advanced_parameters_in_one_batch(
    async_client: openai.AsyncOpenAI, base_url: str, batched: str
) -> None:
    async with httpx.AsyncClient(base_url=base_url.removesuffix("/v1"), timeout=60) as h:
        r = await h.post("/tokenize", json={"model": batched, "prompt": " banana"})
    (banana,) = r.json()["tokens"]
    c = async_client
    lp, echo, *_ = await asyncio.gather(
        _chat_logprobs(c, batched),
        _echo_scores(c, batched),
        _json(c, batched),
        _required_call_streamed(c, batched),
        _named_call(c, batched),
        _forced_banana(c, batched, banana),
    )
    # The same numbers as the one-sequence engine on the same weights.
    want_lp, want_echo = await asyncio.gather(_chat_logprobs(c, CHAT_MODEL), _echo_scores(c, CHAT_MODEL))
    assert [e.token for e in lp] == [e.token for e in want_lp]
    for got, want in zip(lp, want_lp, strict=True):
        assert math.isclose(got.logprob, want.logprob, abs_tol=TOL)
        assert got.top_logprobs[0].token == want.top_logprobs[0].token == got.token
        assert len(got.top_logprobs) == 3
    assert echo.tokens == want_echo.tokens and echo.text_offset == want_echo.text_offset
    assert echo.token_logprobs[0] is None and echo.top_logprobs[0] is None
    for got, want in zip(echo.token_logprobs[1:], want_echo.token_logprobs[1:], strict=True):
        assert math.isclose(got, want, abs_tol=TOL)
    for got, want in zip(echo.top_logprobs[1:], want_echo.top_logprobs[1:], strict=True):
        assert max(got, key=got.get) == max(want, key=want.get)


def test_suffix_is_refused_for_the_model_not_the_engine(client: openai.OpenAI, batched: str) -> None:
    """SmolLM2 has no fill-in-the-middle tokens: the same 400 as the one-sequence engine's."""
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=batched, prompt="def add(a, b):", suffix="    return c", max_tokens=4)
    body: Any = exc.value.body
    assert body["param"] == "suffix" and "FIM" in body["message"] and "batched" not in body["message"]
