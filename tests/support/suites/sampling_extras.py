"""vLLM's sampling extensions and constrained decoding, sent the way its clients send them (the
openai SDK's `extra_body`), and llama-server's spellings of the same fields.

Each field's effect is asserted in a way that holds on any CPU and on both engines (a suite:
tests/e2e/test_sampling_extras.py runs it on the default gateway, tests/e2e/vllm on vLLM): greedy
references, tokens forced with `logit_bias`, exact token counts, outputs checked against the
constraint they were asked to obey.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

from tests.support.models import CHAT_MODEL
from tests.support.suites.parameters import root, token_ids

PROMPT = "Once upon a time, in a land far away,"
ASK: list[Any] = [{"role": "user", "content": "Name a fruit."}]


def complete(client: openai.OpenAI, model: str = CHAT_MODEL, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 12)
    kw.setdefault("prompt", PROMPT)
    return client.completions.create(model=model, **kw).choices[0]


def chat(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("messages", ASK)
    return client.chat.completions.create(model=CHAT_MODEL, **kw)


def special_id(base_url: str, text: str) -> int:
    """The id of a special token the chat template writes (`<|im_end|>` ...): /tokenize of a
    rendered conversation, found by its text."""
    r = httpx.post(
        f"{root(base_url)}/tokenize",
        json={
            "model": CHAT_MODEL,
            "messages": ASK,
            "add_generation_prompt": False,
            "return_token_strs": True,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return int(body["tokens"][body["token_strs"].index(text)])


# -- sampling ---------------------------------------------------------------------------------


def test_top_k_1_and_min_p_1_equal_greedy(client: openai.OpenAI) -> None:
    greedy = complete(client, temperature=0).text
    for seed in (1, 2, 3):
        assert complete(client, temperature=1.5, seed=seed, extra_body={"top_k": 1}).text == greedy
        assert complete(client, temperature=1.5, seed=seed, extra_body={"min_p": 1.0}).text == greedy
    # Off (vLLM's -1 and 0) leaves a hot sampler hot.
    hot = {
        complete(client, temperature=1.5, seed=s, extra_body={"top_k": -1, "min_p": 0}).text
        for s in (1, 2, 3)
    }
    assert hot != {greedy}


def test_repetition_penalty_covers_the_prompt(client: openai.OpenAI, base_url: str) -> None:
    """Two tokens lifted far above the rest with `logit_bias` (applied before penalties on both
    engines), " banana" (in the prompt) 20 above " apple" (not): greedy takes " banana"; a
    penalty of 10 divides its lifted logit by 10 and greedy takes " apple"; a penalty below 1
    multiplies it back on top when " apple" is the one lifted higher. 1.0 is off."""
    (banana,) = token_ids(base_url, " banana")
    (apple,) = token_ids(base_url, " apple")

    def pick(banana_bias: int, apple_bias: int, **extra: Any) -> str:
        bias = {str(banana): banana_bias, str(apple): apple_bias}
        return str(
            complete(
                client, prompt="I like banana", max_tokens=1, temperature=0, logit_bias=bias, extra_body=extra
            ).text
        )

    assert pick(100, 80) == " banana"
    assert pick(100, 80, repetition_penalty=1.0) == " banana"
    assert pick(100, 80, repetition_penalty=10.0) == " apple"
    assert pick(100, 80, repeat_penalty=10.0) == " apple"  # llama-server's spelling
    assert pick(80, 100) == " apple"
    assert pick(80, 100, repetition_penalty=0.5) == " banana"


def test_ignore_eos_runs_to_max_tokens(client: openai.OpenAI, base_url: str) -> None:
    eos = special_id(base_url, "<|im_end|>")
    ends = chat(client, max_tokens=8, logit_bias={str(eos): 100})
    assert ends.choices[0].finish_reason == "stop" and not ends.choices[0].message.content
    forced_on = chat(client, max_tokens=8, logit_bias={str(eos): 100}, extra_body={"ignore_eos": True})
    assert forced_on.choices[0].finish_reason == "length"
    assert forced_on.usage is not None and forced_on.usage.completion_tokens == 8
    # What `vllm bench serve --ignore-eos` relies on: exactly max_tokens per request, streamed too.
    stream = chat(
        client,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 40
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_min_tokens_holds_off_the_end(client: openai.OpenAI, base_url: str) -> None:
    eos = special_id(base_url, "<|im_end|>")
    r = chat(client, max_tokens=12, logit_bias={str(eos): 100}, extra_body={"min_tokens": 5})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and 5 <= r.usage.completion_tokens <= 6  # vLLM counts the EOS too


def test_stop_token_ids_end_generation(client: openai.OpenAI, base_url: str) -> None:
    (banana,) = token_ids(base_url, " banana")
    forced = {"logit_bias": {str(banana): 100}, "max_tokens": 6}
    r = chat(client, **forced, extra_body={"stop_token_ids": [banana]})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == ""
    assert r.usage is not None and r.usage.completion_tokens == 1
    kept = chat(client, **forced, extra_body={"stop_token_ids": [banana], "include_stop_str_in_output": True})
    assert kept.choices[0].message.content == " banana"
    # min_tokens bans stop tokens too (vLLM's rule): three other tokens, then the forced stop.
    late = chat(client, **forced, extra_body={"stop_token_ids": [banana], "min_tokens": 3})
    assert late.choices[0].finish_reason == "stop" and "banana" not in (late.choices[0].message.content or "")
    assert late.usage is not None and late.usage.completion_tokens == 4


def test_include_stop_str_in_output_keeps_the_stop_string(client: openai.OpenAI, base_url: str) -> None:
    (banana,) = token_ids(base_url, " banana")
    forced: dict[str, Any] = {"logit_bias": {str(banana): 100}, "max_tokens": 6, "stop": ["ana b"]}
    assert chat(client, **forced).choices[0].message.content == " ban"
    kept = chat(client, **forced, extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content == " banana b" and kept.choices[0].finish_reason == "stop"
    streamed = chat(client, **forced, stream=True, extra_body={"include_stop_str_in_output": True})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == " banana b"


def test_bad_words_and_allowed_token_ids(client: openai.OpenAI, base_url: str) -> None:
    plain = complete(client, prompt="My favourite fruit is the", max_tokens=4, temperature=0).text
    word = plain.split()[0]
    avoided = complete(
        client,
        prompt="My favourite fruit is the",
        max_tokens=4,
        temperature=0,
        extra_body={"bad_words": [word]},
    ).text
    assert word not in avoided.split()
    allowed = [*token_ids(base_url, " banana"), *token_ids(base_url, " apple")]
    only = complete(
        client, max_tokens=5, temperature=1.0, seed=3, extra_body={"allowed_token_ids": allowed}
    ).text
    assert re.fullmatch(r"( banana| apple){5}", only), only


def test_skip_special_tokens_false_shows_them(client: openai.OpenAI, base_url: str) -> None:
    start = special_id(base_url, "<|im_start|>")
    forced = {"logit_bias": {str(start): 100}, "max_tokens": 2, "temperature": 0}
    assert complete(client, **forced).text == ""
    shown = complete(client, **forced, extra_body={"skip_special_tokens": False}).text
    assert shown.replace(" ", "") == "<|im_start|>" * 2


def test_truncate_prompt_tokens_keeps_the_end(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=CHAT_MODEL, prompt=PROMPT * 4, max_tokens=1, extra_body={"truncate_prompt_tokens": 5}
    )
    assert r.usage is not None and r.usage.prompt_tokens == 5


# -- constrained decoding ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"structured_outputs": {"choice": ["red", "green", "blue"]}},
        {"guided_choice": ["red", "green", "blue"]},
    ],
)
def test_choice(client: openai.OpenAI, extra: dict[str, Any]) -> None:
    for seed in (1, 2):
        text = chat(client, max_tokens=10, seed=seed, extra_body=extra).choices[0].message.content
        assert text in {"red", "green", "blue"}
    # ignore_eos cannot outlast a complete grammar: the choice is still the whole text.
    text = chat(client, max_tokens=10, extra_body={**extra, "ignore_eos": True}).choices[0].message.content
    assert text in {"red", "green", "blue"}


@pytest.mark.parametrize("key", ["structured_outputs", "guided_regex"])
def test_regex(client: openai.OpenAI, key: str) -> None:
    pattern = r"\d{3}-[a-z]{2,4}(?:!|\.)"
    extra = {key: {"regex": pattern} if key == "structured_outputs" else pattern}
    text = complete(client, max_tokens=20, seed=5, extra_body=extra).text
    assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("key", ["structured_outputs", "guided_grammar", "grammar"])
def test_gbnf_grammar(client: openai.OpenAI, key: str) -> None:
    gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
    extra = {key: {"grammar": gbnf} if key == "structured_outputs" else gbnf}
    text = chat(client, max_tokens=20, extra_body=extra).choices[0].message.content
    assert text in {"The answer is yes.", "The answer is no."}


@pytest.mark.parametrize("key", ["structured_outputs", "guided_json", "json_schema"])
def test_json_schema(client: openai.OpenAI, key: str) -> None:
    schema = {
        "type": "object",
        "properties": {"fruit": {"type": "string", "enum": ["apple", "pear"]}},
        "required": ["fruit"],
        "additionalProperties": False,
    }
    extra = {key: {"json": schema} if key == "structured_outputs" else schema}
    text = chat(client, max_tokens=30, extra_body=extra).choices[0].message.content
    assert json.loads(text)["fruit"] in {"apple", "pear"}


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"length_penalty": 0.5}, "length_penalty"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a" * 5000}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs"),
        (
            {"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
            "structured_outputs",
        ),
    ],
)
def test_bad_extensions_are_400_naming_the_field(base_url: str, extra: dict[str, Any], param: str) -> None:
    body = {"model": CHAT_MODEL, "messages": ASK, "max_tokens": 4, **extra}
    r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_a_regex_llama_cpp_cannot_express_is_400(base_url: str, backend: str) -> None:
    body = {"model": CHAT_MODEL, "prompt": "x", "max_tokens": 4, "structured_outputs": {"regex": r"(a)\1"}}
    r = httpx.post(f"{base_url}/completions", json=body, timeout=60)
    if backend == "llama_cpp":
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "structured_outputs"
        assert "back-references" in r.json()["error"]["message"]
    else:
        assert r.status_code in (200, 400), r.text  # vLLM's xgrammar decides
