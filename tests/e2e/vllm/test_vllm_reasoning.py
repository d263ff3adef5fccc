"""`tiny-reasoner` on the vLLM engine (its Hugging Face folder, tests/support/reasoning.py): the
same split as on llama.cpp, through the same template rendering and parser. Deployed on the
default gateway, so only its own EngineCore starts.

vLLM does not enforce the thinking budget, and the model rarely writes `</think>`: what holds is
that the thinking the template opened comes back as reasoning (none of it in `content`), stream and
not alike, and that thinking switched off leaves none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.admin import deployed
from tests.support.gateway import GatewayProcess
from tests.support.openapi import validate
from tests.support.reasoning import MODEL, reasoner_spec, tiny_reasoner_hf

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture(scope="module")
def reasoner(vllm_setup: None, default_gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    spec = reasoner_spec(
        backend="vllm",
        source={"path": tiny_reasoner_hf()},
        num_cpus=1,
        engine={"max_model_len": 1024, "enforce_eager": True},
        env=ENV,
    )
    with deployed(default_gateway.url, spec, timeout=900):
        with openai.OpenAI(
            base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as c:
            yield c


def ask(client: openai.OpenAI, **fields: Any) -> dict[str, Any]:
    body = {"max_tokens": 8, "min_tokens": 8, "temperature": 0.0, **fields}
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, extra_body=body)  # type: ignore[arg-type]
    data: dict[str, Any] = json.loads(raw.text)
    validate(data, "CreateChatCompletionResponse")
    return data


def test_thinking_split_stream_and_not(reasoner: openai.OpenAI) -> None:
    data = ask(reasoner)
    message = data["choices"][0]["message"]
    assert message["reasoning_content"] and message["reasoning"] == message["reasoning_content"]
    assert not message["content"]  # no end marker before max_tokens: all of it is thinking
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 8
    thought, answer = "", ""
    stream = reasoner.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        stream=True,
        extra_body={"max_tokens": 8, "min_tokens": 8, "temperature": 0.0},  # type: ignore[arg-type]
    )
    for chunk in stream:
        for choice in chunk.choices:
            thought += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            answer += choice.delta.content or ""
    assert thought == message["reasoning_content"] and answer == ""


def test_thinking_off(reasoner: openai.OpenAI) -> None:
    data = ask(reasoner, min_tokens=2, chat_template_kwargs={"enable_thinking": False})
    message = data["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"]
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
