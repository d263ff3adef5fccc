"""vLLM's sampling extensions and constrained decoding on the default (llama.cpp) gateway: the
suite both engines pass (tests/support/suites/sampling_extras.py; tests/e2e/vllm reruns it), then
a deployment's `defaults:` under the request, on a model of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.admin import chat_spec, deployed
from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate
from tests.support.suites.parameters import token_ids
from tests.support.suites.sampling_extras import (  # noqa: F401
    ASK,
    complete,
    test_a_regex_llama_cpp_cannot_express_is_400,
    test_bad_extensions_are_400_naming_the_field,
    test_bad_words_and_allowed_token_ids,
    test_choice,
    test_gbnf_grammar,
    test_ignore_eos_runs_to_max_tokens,
    test_include_stop_str_in_output_keeps_the_stop_string,
    test_json_schema,
    test_min_tokens_holds_off_the_end,
    test_regex,
    test_repetition_penalty_covers_the_prompt,
    test_skip_special_tokens_false_shows_them,
    test_stop_token_ids_end_generation,
    test_top_k_1_and_min_p_1_equal_greedy,
    test_truncate_prompt_tokens_keeps_the_end,
)

# -- per-model defaults -----------------------------------------------------------------------

DEFAULTS_MODEL = "smollm2-defaults"


# A model folder's recommendations (Hugging Face's file, as vLLM reads it): under `defaults:`.
GENERATION_CONFIG = {"temperature": 0.7, "top_k": 20, "top_p": 1.0, "max_new_tokens": 99, "eos_token_id": 2}


@pytest.fixture(scope="module")
def defaults_model(
    default_gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The chat model deployed again with `defaults:` through /admin, as an operator would, over a
    `generation_config.json` of its own."""
    url = default_gateway.url
    folder = tmp_path_factory.mktemp("generation-config")
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    spec = chat_spec(
        DEFAULTS_MODEL,
        defaults={"temperature": 0, "max_tokens": 6, "repetition_penalty": 10.0},
        generation_config=str(folder),
    )
    with deployed(url, spec) as name:
        yield name


def test_model_defaults_apply_under_the_request(default_gateway: GatewayProcess, defaults_model: str) -> None:
    with openai.OpenAI(
        base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as c:
        prompt = "la la la la la la la la"
        seen = set(token_ids(f"{default_gateway.url}/v1", prompt))
        unset = [
            complete(
                c,
                defaults_model,
                prompt=prompt,
                max_tokens=openai.NOT_GIVEN,
                seed=s,
                extra_body={"ignore_eos": True},
            )
            for s in (1, 2)
        ]
        # temperature 0 (greedy: both seeds agree), max_tokens 6, and the strong penalty apply.
        assert unset[0].text == unset[1].text and unset[0].finish_reason == "length"
        ids = token_ids(f"{default_gateway.url}/v1", unset[0].text)
        assert ids[0] not in seen
        # What the request sets wins: the penalty off gives the plain model's greedy answer.
        plain = complete(
            c, CHAT_MODEL, prompt=prompt, max_tokens=3, temperature=0, extra_body={"repetition_penalty": 1.0}
        ).text
        assert (
            complete(
                c, defaults_model, prompt=prompt, max_tokens=3, extra_body={"repetition_penalty": 1.0}
            ).text
            == plain
        )
        r = c.chat.completions.create(
            model=defaults_model, messages=ASK, max_completion_tokens=2, extra_body={"ignore_eos": True}
        )
        assert r.usage is not None and r.usage.completion_tokens == 2


def test_model_card_lists_extensions_and_defaults(
    default_gateway: GatewayProcess, defaults_model: str
) -> None:
    card = httpx.get(f"{default_gateway.url}/v1/models/{defaults_model}", timeout=30).json()
    validate(card, "Model")
    # `defaults:` win over the generation config; its top_k (top_p is Hugging Face's default) shows.
    assert card["sampling_defaults"] == {
        "temperature": 0,
        "max_tokens": 6,
        "repetition_penalty": 10.0,
        "top_k": 20,
    }
    assert {"top_k", "min_p", "ignore_eos", "structured_outputs", "guided_json", "repeat_penalty"} <= set(
        card["sampling_parameters"]
    )
    assert "length_penalty" not in card["sampling_parameters"]
    listed = httpx.get(f"{default_gateway.url}/v1/models", timeout=30).json()["data"]
    assert all(set(m) == {"id", "object", "created", "owned_by", "task"} for m in listed)


def test_defaults_are_strict(default_gateway: GatewayProcess) -> None:
    spec = chat_spec("bad-defaults", defaults={"temprature": 0.5})
    r = httpx.post(f"{default_gateway.url}/admin/deployments", json=spec, timeout=30)
    assert r.status_code == 400, r.text
    assert "temprature" in r.text
