"""Text completions: prompt forms, echo, streaming, usage."""

from __future__ import annotations

import openai

from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate


def test_completion_shape(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=CHAT_MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    body = out.model_dump(mode="json", exclude_unset=True)
    validate(body, "CreateCompletionResponse")
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    assert out.choices[0].text
    assert out.usage is not None
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert 0 < out.usage.completion_tokens <= 8


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=CHAT_MODEL, prompt="Once upon a time, in a land far away,", temperature=0
    )
    assert out.usage is not None and out.usage.completion_tokens <= 16


def test_token_id_prompt_matches_text_prompt(client: openai.OpenAI) -> None:
    text = client.completions.create(model=CHAT_MODEL, prompt="Hello world", max_tokens=5, temperature=0)
    assert text.usage is not None
    # SmolLM2's GPT-2 style vocabulary: "Hello" = 19556, " world" = 905.
    ids = client.completions.create(model=CHAT_MODEL, prompt=[19556, 905], max_tokens=5, temperature=0)
    assert ids.usage is not None and ids.usage.prompt_tokens == 2
    assert ids.choices[0].text == text.choices[0].text


def test_several_prompts(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=CHAT_MODEL, prompt=["One, two,", "A, B,"], max_tokens=4, temperature=0
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.text for c in out.choices)


def test_echo(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=CHAT_MODEL, prompt="Roses are red,", max_tokens=4, echo=True, temperature=0
    )
    assert out.choices[0].text.startswith("Roses are red,")


def test_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=CHAT_MODEL,
            prompt="1, 2, 3,",
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for c in chunks:
        body = c.model_dump(mode="json", exclude_unset=True)
        # The spec shares one schema between the body and stream chunks, but OpenAI's own stream
        # (and every client) has `finish_reason: null` until the last chunk of a choice.
        for choice in body["choices"][:-1] if body["choices"] else []:
            assert choice["finish_reason"] is None
        body["choices"] = [{**ch, "finish_reason": ch["finish_reason"] or "length"} for ch in body["choices"]]
        validate(body, "CreateCompletionResponse")
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens <= 10
