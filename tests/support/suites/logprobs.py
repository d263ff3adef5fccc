"""Log-probabilities in both of OpenAI's formats, streamed and not, checked against the spec."""

from __future__ import annotations

import math

import httpx
import openai

from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate

ASK = [{"role": "user", "content": "Name a color."}]


def test_chat_logprobs_shape_and_values(client: openai.OpenAI, base_url: str) -> None:
    raw = httpx.post(
        f"{base_url}/chat/completions",
        json={
            "model": CHAT_MODEL,
            "messages": ASK,
            "max_tokens": 6,
            "temperature": 0,
            "repetition_penalty": 1.0,  # pure greedy: the default config ships a penalty
            "logprobs": True,
            "top_logprobs": 3,
        },
        timeout=120,
    )
    assert raw.status_code == 200, raw.text
    body = raw.json()
    validate(body, "CreateChatCompletionResponse")
    choice = body["choices"][0]
    entries = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert len(entries) == body["usage"]["completion_tokens"]
    assert "".join(e["token"] for e in entries) == choice["message"]["content"]
    for e in entries:
        assert e["logprob"] <= 0 and bytes(e["bytes"]).decode() == e["token"]
        tops = e["top_logprobs"]
        assert len(tops) == 3
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        # Greedy decoding picks the likeliest token, so it heads its own alternatives.
        assert tops[0]["token"] == e["token"] and math.isclose(tops[0]["logprob"], e["logprob"])
        assert sum(math.exp(t["logprob"]) for t in tops) <= 1.0 + 1e-6

    sdk = client.chat.completions.create(model=CHAT_MODEL, messages=ASK, max_tokens=4, logprobs=True)  # type: ignore[arg-type]
    assert sdk.choices[0].logprobs is not None and sdk.choices[0].logprobs.content
    assert sdk.choices[0].logprobs.content[0].top_logprobs == []
    plain = client.chat.completions.create(model=CHAT_MODEL, messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=ASK,
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,  # type: ignore[arg-type]
        )
    )
    for c in chunks:
        validate(c.model_dump(mode="json", exclude_unset=True), "CreateChatCompletionStreamResponse")
    entries = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert entries and "".join(e.token for e in entries) == text
    assert all(len(e.top_logprobs) == 2 for e in entries)


def test_completions_logprobs(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=CHAT_MODEL, prompt="One, two, three,", max_tokens=5, temperature=0, logprobs=2
    )
    validate(out.model_dump(mode="json", exclude_unset=True), "CreateCompletionResponse")
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert "".join(lp.tokens) == out.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    # Five unless the model ended its text first (where it does depends on the CPU's numbers).
    assert len(lp.tokens) == 5 if out.choices[0].finish_reason == "length" else 1 <= len(lp.tokens) <= 5
    assert lp.text_offset[:2] == [0, len(lp.tokens[0])][: len(lp.tokens)]  # a second only if written
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob is not None and logprob <= 0
        assert token in top and 2 <= len(top) <= 3  # the sampled token is always listed

    zero = client.completions.create(model=CHAT_MODEL, prompt="One,", max_tokens=2, logprobs=0)
    assert zero.choices[0].logprobs is not None
    n = len(zero.choices[0].logprobs.tokens or [])
    assert n == 2 if zero.choices[0].finish_reason == "length" else 1 <= n <= 2


def test_completions_echo_scores_the_prompt(client: openai.OpenAI) -> None:
    """echo + logprobs + max_tokens=1 is how evaluation harnesses score a text."""
    prompt = "The capital of France is Paris"
    out = client.completions.create(
        model=CHAT_MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0
    )
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.text_offset
    assert out.choices[0].text.startswith(prompt)
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.token_logprobs[0] is None and lp.top_logprobs is not None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # " Paris" after "The capital of France is" is far likelier than " Berlin".
    berlin = (
        client.completions.create(
            model=CHAT_MODEL, prompt=prompt.replace("Paris", "Berlin"), max_tokens=1, echo=True, logprobs=0
        )
        .choices[0]
        .logprobs
    )
    assert berlin is not None and berlin.token_logprobs
    assert lp.token_logprobs[-2] > berlin.token_logprobs[-2]  # type: ignore[operator]


def test_completions_logprobs_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=CHAT_MODEL, prompt="A, B, C,", max_tokens=4, temperature=0, logprobs=1, stream=True
        )
    )
    tokens = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []
    ]
    offsets = [
        o
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for o in c.choices[0].logprobs.text_offset or []
    ]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert "".join(tokens) == text and 1 <= len(tokens) <= 4
    assert (finish == ["length"] and len(tokens) == 4) or finish == ["stop"]
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]


def test_top_logprobs_needs_logprobs(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": CHAT_MODEL, "messages": ASK, "top_logprobs": 2},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    r = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": CHAT_MODEL, "messages": ASK, "logprobs": True, "top_logprobs": 21},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
