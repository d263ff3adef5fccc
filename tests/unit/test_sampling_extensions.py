"""The request-side pieces of vLLM's extensions, without Ray or a model: parsing and the other
spellings, defaults under the request, the regex/choice grammars, kept stop strings, and the
bounded unknown-field log."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from pydantic import ValidationError

from raygate.backends.engines.llama_cpp import gbnf
from raygate.backends.engines.text_stream import StopMatcher
from raygate.protocol.chat import ChatCompletionRequest
from raygate.protocol.completions import CompletionRequest
from raygate.protocol.errors import BadRequestError
from raygate.protocol.sampling_defaults import SamplingDefaults
from raygate.server.transport.unknown_fields import UnknownFieldLog

ASK: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]


def chat(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": ASK, **kw})


def test_extensions_reach_sampling_params() -> None:
    p = chat(
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.2,
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=[7],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        truncate_prompt_tokens=-1,
        allowed_token_ids=[1, 2],
        bad_words=["x"],
    ).to_sampling_params()
    assert (p.top_k_limit, p.min_p, p.repetition_penalty, p.min_tokens, p.ignore_eos) == (
        5,
        0.1,
        1.2,
        2,
        True,
    )
    assert (p.stop_token_ids, p.include_stop_str_in_output, p.skip_special_tokens) == ([7], True, False)
    assert (p.truncate_prompt_tokens, p.allowed_token_ids, p.bad_words) == (-1, [1, 2], ["x"])
    off = chat(top_k=-1).to_sampling_params()
    assert off.top_k_limit is None and off.min_p == 0 and off.repetition_penalty == 1.0
    assert not off.constrained and off.stop_token_ids == [] and off.allowed_token_ids is None


def test_other_spellings_fold_into_one_field() -> None:
    assert chat(repeat_penalty=1.3).to_sampling_params().repetition_penalty == 1.3
    assert chat(guided_regex="a+").to_sampling_params().regex == "a+"
    assert chat(guided_choice=["a", "b"]).to_sampling_params().choice == ["a", "b"]
    assert chat(grammar='root ::= "a"').to_sampling_params().grammar == 'root ::= "a"'
    assert chat(json_schema={"type": "object"}).to_sampling_params().json_schema == {"type": "object"}
    assert chat(guided_json='{"type": "string"}').to_sampling_params().json_schema == {"type": "string"}
    assert chat(structured_outputs={"json_object": True}).to_sampling_params().json_schema == {
        "type": "object"
    }
    assert not chat(guided_regex="a").model_extra  # consumed, so not logged as unknown
    with pytest.raises(ValidationError):
        chat(repeat_penalty=1.3, repetition_penalty=1.2)
    with pytest.raises(ValidationError):
        chat(guided_regex="a", guided_choice=["b"])
    with pytest.raises(ValidationError):
        chat(structured_outputs={"regex": "a"}, guided_grammar="root ::= x")


def test_n_probs_is_the_endpoints_logprobs() -> None:
    assert chat(n_probs=3).to_sampling_params().logprobs == 3
    body = CompletionRequest.model_validate({"model": "m", "prompt": "x", "n_probs": 2})
    assert body.to_sampling_params().logprobs == 2 and not body.model_extra
    with pytest.raises(ValidationError):
        chat(n_probs=3, top_logprobs=2)


def test_refusals_name_the_field() -> None:
    with pytest.raises(BadRequestError) as exc:
        chat(min_tokens=5, max_tokens=2).to_sampling_params()
    assert exc.value.param == "min_tokens"
    with pytest.raises(BadRequestError) as exc:
        chat(guided_json="[1", max_tokens=2).to_sampling_params()
    assert exc.value.param == "structured_outputs"
    assert chat(length_penalty=0.7, use_beam_search=True).unsupported_fields() == [
        "use_beam_search",
        "length_penalty",
    ]
    assert chat(length_penalty=1.0).unsupported_fields() == []
    with pytest.raises(ValidationError):
        chat(repetition_penalty=float("inf"))


def test_defaults_fill_only_what_the_request_left_unset() -> None:
    defaults = SamplingDefaults(temperature=0.6, top_k=20, max_tokens=50, repetition_penalty=1.1)
    got = defaults.under(chat(temperature=1.0)).to_sampling_params()
    assert (got.temperature, got.top_k, got.max_tokens, got.repetition_penalty) == (1.0, 20, 50, 1.1)
    # max_completion_tokens is the same field as max_tokens.
    assert defaults.under(chat(max_completion_tokens=3)).to_sampling_params().max_tokens == 3
    # The completions default of 16 is OpenAI's default, not the request's choice.
    body = CompletionRequest.model_validate({"model": "m", "prompt": "x"})
    assert defaults.under(body).to_sampling_params().max_tokens == 50
    assert SamplingDefaults().under(body) is body
    with pytest.raises(ValidationError):
        SamplingDefaults.model_validate({"temprature": 0.5})


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        (r"\d{3}-[a-z]+", "123-ab", "12-ab"),
        (r"(?:ab)+c?", "ababc", "abca"),
        (r"^(yes|no)$", "no", "yesno"),
        (r"[^\"\\]{2,5}", "abc", 'a"'),
    ],
)
def test_regex_grammar_matches_what_the_regex_matches(pattern: str, good: str, bad: str) -> None:
    """Structural checks only (the grammar is compiled by llama.cpp in the engine tests)."""
    assert re.fullmatch(pattern, good) and not re.fullmatch(pattern, bad)
    grammar = gbnf.regex_grammar(pattern)
    assert grammar.startswith("root ::= ") and "\\d" not in grammar and "(?" not in grammar


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"(?=a)b", "look-ahead"),
        (r"(a)\1", "back-references"),
        (r"(?i)a", "flags"),
        (r"a{2000}", "1000"),
        ("(", "Invalid"),
    ],
)
def test_regex_grammar_refuses_what_gbnf_cannot_say(pattern: str, says: str) -> None:
    with pytest.raises(BadRequestError) as exc:
        gbnf.regex_grammar(pattern)
    assert exc.value.param == "structured_outputs" and says in str(exc.value)


def test_choice_grammar_escapes() -> None:
    assert gbnf.choice_grammar(['a "b"', "c\\d", "é"]) == 'root ::= "a \\x22b\\x22" | "c\\x5Cd" | "\\xE9"\n'


def test_stop_matcher_can_keep_the_stop_string() -> None:
    keep = StopMatcher(["ana b"], include=True)
    assert keep.push(" banana") == (" ban", False)
    assert keep.push(" banana") == ("ana b", True)
    drop = StopMatcher(["ana b"])
    assert drop.push(" banana banana") == (" ban", True)


def test_unknown_field_log_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    notes = UnknownFieldLog(max_logged=3)
    with caplog.at_level(logging.WARNING):
        for i in range(10):
            notes.note("chat", chat(**{f"x{i}": 1}))
            notes.note("chat", chat(**{f"x{i}": 1}))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and "further ones are ignored" in lines[-1]
    assert len(notes.seen) == 3


def test_unknown_field_is_one_warning_per_name(caplog: pytest.LogCaptureFixture) -> None:
    notes = UnknownFieldLog()
    with caplog.at_level(logging.WARNING):
        notes.note("chat.completions", chat(made_up=1))
        notes.note(
            "completions", CompletionRequest.model_validate({"model": "m", "prompt": "x", "made_up": 2})
        )
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring unknown field 'made_up' on chat.completions"
    ]
