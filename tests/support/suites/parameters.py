"""logit_bias, the tokenizer routes' errors and the developer role: the part of
tests/e2e/test_parameters.py every backend passes (it runs them on the default gateway,
tests/e2e/vllm/test_vllm_openai_suite.py on vLLM). `root` and `token_ids` reach /tokenize for the
sampling suite too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.support.models import CHAT_MODEL

ASK: list[Any] = [{"role": "user", "content": "Name a fruit."}]


def root(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def token_ids(base_url: str, text: str, model: str = CHAT_MODEL) -> list[int]:
    r = httpx.post(f"{root(base_url)}/tokenize", json={"model": model, "prompt": text}, timeout=60)
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


def test_logit_bias_forces_and_bans(client: openai.OpenAI, base_url: str) -> None:
    (banana,) = token_ids(base_url, " banana")
    forced = client.chat.completions.create(
        model=CHAT_MODEL, messages=ASK, max_tokens=3, logit_bias={str(banana): 100}, temperature=1.0, seed=1
    )
    assert forced.choices[0].message.content == " banana" * 3
    free = client.completions.create(
        model=CHAT_MODEL, prompt="My favourite fruit is", max_tokens=1, temperature=0
    )
    first = token_ids(base_url, free.choices[0].text)[0]
    banned = client.completions.create(
        model=CHAT_MODEL,
        prompt="My favourite fruit is",
        max_tokens=1,
        temperature=0,
        logit_bias={str(first): -100},
    )
    assert banned.choices[0].text and banned.choices[0].text != free.choices[0].text


# Characters the byte-level vocabulary spells in several tokens (at least one of them does).
RARE_CHARACTERS = ("\U00013000", "\U0001f701", "\ua66e")


def test_a_stream_sends_a_chunk_per_token_while_a_character_is_incomplete(
    client: openai.OpenAI, base_url: str
) -> None:
    """A token that leaves a character unfinished still gets its chunk, with empty text, as `vllm
    serve` streams: a client's stream keeps the engine's pace instead of a gap twice as long
    wherever a character spans two tokens. Forcing a character's first piece makes every token an
    unfinished character."""
    pieces = next(ids for ids in (token_ids(base_url, c) for c in RARE_CHARACTERS) if len(ids) > 1)

    def streamed(create: Callable[..., Any], **prompt: Any) -> tuple[list[Any], int]:
        """The stream's chunks that carry a choice, and its completion tokens (usage)."""
        chunks = list(
            create(
                model=CHAT_MODEL,
                max_tokens=6,
                logit_bias={str(pieces[0]): 100},
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                **prompt,
            )
        )
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 6
        return [c.choices[0] for c in chunks if c.choices], usage.completion_tokens

    choices, tokens = streamed(client.completions.create, prompt="Write:")
    texts = [c.text for c in choices]
    assert len(texts) == tokens  # one chunk per token
    assert "" in texts[:-1]  # a token whose character is not whole yet
    choices, tokens = streamed(client.chat.completions.create, messages=ASK)
    contents = [c.delta.content for c in choices]
    assert contents[0] == ""  # the role's chunk, as OpenAI opens a stream
    assert len(contents[1:]) == tokens
    assert "" in contents[1:-1]


@pytest.mark.parametrize("bias", [{"x": 1}, {"5": 101}, {"-3": 1}, {"99999999": 5}])
def test_bad_logit_bias_is_400(base_url: str, bias: dict[str, float]) -> None:
    r = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": CHAT_MODEL, "messages": ASK, "max_tokens": 2, "logit_bias": bias},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "logit_bias"


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": CHAT_MODEL}, 400, None),
        (
            "/tokenize",
            {"model": CHAT_MODEL, "prompt": "x", "messages": [{"role": "user", "content": "x"}]},
            400,
            None,
        ),
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"model": CHAT_MODEL, "prompt": "x", "chat_template": "{{x}}"}, 400, "chat_template"),
        ("/detokenize", {"model": CHAT_MODEL, "tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"model": CHAT_MODEL, "tokens": []}, 400, "tokens"),
    ],
)
def test_tokenizer_errors(
    base_url: str, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = httpx.post(f"{root(base_url)}{path}", json=body, timeout=60)
    assert r.status_code == status, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param


def test_developer_role_is_a_system_turn(client: openai.OpenAI, base_url: str) -> None:
    messages: list[Any] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    out = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=2)
    assert out.choices[0].message.content is not None
    tok = httpx.post(
        f"{root(base_url)}/tokenize",
        json={"model": CHAT_MODEL, "messages": messages, "return_token_strs": True},
        timeout=60,
    ).json()
    assert "".join(tok["token_strs"]).startswith("<|im_start|>system\nBe brief.<|im_end|>")
