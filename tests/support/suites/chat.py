"""Chat completions through the real openai SDK, checked against OpenAI's published schema."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate

HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
# SmolLM2's end-of-text and end-of-turn tokens, banned where a test needs the full max_tokens of
# text: where a tiny model stops on its own moves with the CPU's numbers.
NO_EOS = {"0": -100, "2": -100}


def test_non_stream_shape_and_usage(client: openai.OpenAI, base_url: str) -> None:
    raw = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": CHAT_MODEL, "messages": HELLO, "max_tokens": 12},
        timeout=120,
    )
    assert raw.status_code == 200
    body = raw.json()
    validate(body, "CreateChatCompletionResponse")
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == CHAT_MODEL
    assert isinstance(body["created"], int) and body["created"] > 1_700_000_000
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["refusal"] is None and choice["logprobs"] is None
    assert choice["message"]["content"].strip()
    usage = body["usage"]
    assert usage["prompt_tokens"] > 5
    assert 0 < usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    sdk = client.chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=12)  # type: ignore[arg-type]
    assert sdk.choices[0].message.content
    assert sdk.choices[0].finish_reason in ("stop", "length")


def test_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    for c in chunks:
        validate(c.model_dump(mode="json", exclude_unset=True), "CreateChatCompletionStreamResponse")
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert 0 < last.usage.completion_tokens <= 16
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens


def test_max_completion_tokens_is_honoured(client: openai.OpenAI) -> None:
    """LangChain's ChatOpenAI sends only max_completion_tokens."""
    out = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_completion_tokens=5,
        logit_bias=NO_EOS,  # the model may not end first, so the budget must end it
    )
    assert out.usage is not None and out.usage.completion_tokens == 5
    assert out.choices[0].finish_reason == "length"


def test_greedy_is_deterministic_and_seed_repeats(client: openai.OpenAI) -> None:
    def ask(**kw: object) -> str:
        out = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": "Name three colors."}],
            max_tokens=20,
            **kw,  # type: ignore[arg-type]
        )
        return out.choices[0].message.content or ""

    assert ask(temperature=0) == ask(temperature=0)
    assert ask(temperature=1.0, seed=1234) == ask(temperature=1.0, seed=1234)
    samples = {ask(temperature=1.5, top_p=1.0, seed=s) for s in range(4)}
    assert len(samples) > 1, "different seeds at high temperature should differ"


def stop_inside(text: str) -> str:
    """A stop string taken from the middle of this machine's own greedy answer: the stop tests
    then hold for whatever text the model writes here (another CPU writes other text)."""
    assert len(text) >= 8, text
    middle = len(text) // 2
    return text[middle : middle + 3]


def greedy_count(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model=CHAT_MODEL,
        messages=COUNT,  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0,
        logit_bias=NO_EOS,
        **kw,  # type: ignore[arg-type]
    )


def test_stop_sequence_ends_text_without_leaking(client: openai.OpenAI) -> None:
    full = greedy_count(client).choices[0].message.content or ""
    stop = stop_inside(full)
    cut = greedy_count(client, stop=[stop, "never in this text \u2603"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == full[: full.index(stop)]


def test_stop_in_stream(client: openai.OpenAI) -> None:
    full = greedy_count(client).choices[0].message.content or ""
    stop = stop_inside(full)
    stream = greedy_count(client, stop=stop, stream=True)
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full[: full.index(stop)] and stop not in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]


def test_n_choices(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=HELLO,
        max_tokens=6,
        n=2,
        seed=7,  # type: ignore[arg-type]
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.message.content for c in out.choices)
    assert out.usage is not None
    assert 2 <= out.usage.completion_tokens <= 12  # both choices counted, each at most 6
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=HELLO,
        max_tokens=6,
        n=2,
        stream=True,  # type: ignore[arg-type]
    )
    finished = {c.choices[0].index for c in stream if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_content_parts_and_roles(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi."}]},
        ],
        max_tokens=8,
    )
    assert out.choices[0].message.content


def test_raw_sse_framing(base_url: str) -> None:
    """Every event is `data: <json>` plus a blank line; the stream ends with `data: [DONE]`."""
    with httpx.stream(
        "POST",
        f"{base_url}/chat/completions",
        json={"model": CHAT_MODEL, "messages": HELLO, "max_tokens": 8, "stream": True},
        timeout=120,
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    for event in events[:-1]:
        if event.startswith(":"):
            continue  # keep-alive comment
        assert event.startswith("data: ") and "\n" not in event
        chunk = json.loads(event[len("data: ") :])
        validate(chunk, "CreateChatCompletionStreamResponse")


@pytest.mark.parametrize("alias", ["smollm2"])
def test_alias_reaches_model(client: openai.OpenAI, alias: str) -> None:
    out = client.chat.completions.create(model=alias, messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    assert out.model == alias
