"""The remaining OpenAI parameters: logit_bias, penalties, suffix, user, fields no backend here
can honour, and vLLM's /tokenize and /detokenize. The logit_bias, tokenizer-error and developer-role
tests are a suite every backend passes (tests/support/suites/parameters.py; tests/e2e/vllm reruns
it)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.structured import penalty_must_change
from tests.support.suites.parameters import (  # noqa: F401
    ASK,
    root,
    test_a_stream_sends_a_chunk_per_token_while_a_character_is_incomplete,
    test_bad_logit_bias_is_400,
    test_developer_role_is_a_system_turn,
    test_logit_bias_forces_and_bans,
    test_tokenizer_errors,
)


def test_penalties_change_a_greedy_text_they_must_change(client: openai.OpenAI) -> None:
    """Greedy decoding, so any difference comes from the penalty. Whether a penalty changes a
    greedy text depends on the text, which depends on the CPU: of a few prompts, the test takes
    one whose greedy text, by its own logprobs, a penalty of 2 must change
    (tests/support/structured.py), then checks that it does."""

    def say(prompt: str, **kw: float) -> Any:
        return client.completions.create(
            model=CHAT_MODEL,
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            logprobs=5,
            extra_body={"repetition_penalty": 1.0},  # off, whatever the model's `defaults:` say
            **kw,
        ).choices[0]

    for prompt in ("la la la la la la", "1, 2, 1, 2, 1, 2,", "My favourite things are", "Once upon a time"):
        plain = say(prompt)
        lp = plain.logprobs
        assert lp is not None and lp.tokens and lp.top_logprobs
        if penalty_must_change(lp.tokens, lp.top_logprobs, frequency=2.0) and penalty_must_change(
            lp.tokens, lp.top_logprobs, presence=2.0
        ):
            break
    else:
        raise AssertionError("no prompt's greedy text is one a penalty must change")
    assert say(prompt, frequency_penalty=2.0).text != plain.text
    assert say(prompt, presence_penalty=2.0).text != plain.text
    assert say(prompt, frequency_penalty=0.0).text == plain.text


def test_suffix_needs_a_fill_in_the_middle_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(
            model=CHAT_MODEL, prompt="def add(a, b):", suffix="    return c", max_tokens=4
        )
    assert exc.value.code == "unsupported_parameter"
    body: Any = exc.value.body
    assert body["param"] == "suffix" and "llama_cpp" in body["message"] and "FIM" in body["message"]


def test_user_is_accepted(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=CHAT_MODEL, messages=ASK, max_tokens=2, user="user-1234")
    assert out.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("store", True),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
    ],
)
def test_fields_no_backend_honours_are_refused_by_name(base_url: str, field: str, value: Any) -> None:
    r = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": CHAT_MODEL, "messages": ASK, "max_tokens": 2, field: value},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["code"] == "unsupported_parameter"


def test_harmless_settings_of_those_fields_are_accepted(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/chat/completions",
        json={
            "model": CHAT_MODEL,
            "messages": ASK,
            "max_tokens": 2,
            "store": False,
            "modalities": ["text"],
            "service_tier": "auto",
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_best_of_above_n_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=CHAT_MODEL, prompt="x", max_tokens=2, best_of=3)
    assert exc.value.code == "unsupported_parameter"


def test_tokenize_and_detokenize(base_url: str) -> None:
    url = root(base_url)
    r = httpx.post(
        f"{url}/tokenize",
        json={"model": CHAT_MODEL, "prompt": "Hello world", "return_token_strs": True},
        timeout=60,
    )
    assert r.status_code == 200
    body = r.json()
    # SmolLM2's GPT-2 style vocabulary: "Hello" = 19556, " world" = 905.
    assert body == {
        "count": 2,
        "max_model_len": 2048,
        "tokens": [19556, 905],
        "token_strs": ["Hello", " world"],
    }
    assert (
        "token_strs"
        not in httpx.post(f"{url}/tokenize", json={"model": "smollm2", "prompt": "Hi"}, timeout=60).json()
    )
    r = httpx.post(f"{url}/detokenize", json={"model": CHAT_MODEL, "tokens": [19556, 905]}, timeout=60)
    assert r.json() == {"prompt": "Hello world"}

    chat = httpx.post(
        f"{url}/tokenize",
        json={
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "return_token_strs": True,
        },
        timeout=60,
    ).json()
    assert "".join(chat["token_strs"]).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    no_prompt = httpx.post(
        f"{url}/tokenize",
        json={
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "add_generation_prompt": False,
        },
        timeout=60,
    ).json()
    assert no_prompt["count"] < chat["count"]

    # The embedding model has its own (BERT word-piece) tokenizer, with [CLS] ... [SEP].
    emb = httpx.post(
        f"{url}/tokenize",
        json={"model": EMBED_MODEL, "prompt": "hello world", "return_token_strs": True},
        timeout=60,
    ).json()
    assert emb["max_model_len"] == 512 and emb["token_strs"] == ["[CLS]", " hello", " world", "[SEP]"]
    back = httpx.post(
        f"{url}/detokenize", json={"model": EMBED_MODEL, "tokens": emb["tokens"][1:-1]}, timeout=60
    ).json()
    assert back["prompt"].strip() == "hello world"
