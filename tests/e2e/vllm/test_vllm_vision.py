"""`tiny-vlm` on the vLLM engine (its Hugging Face folder, tests/support/vision.py): the images reach
vLLM's own Idefics3 processor as `multi_modal_data`, and the same request gives the same prompt
layout as on llama.cpp's mtmd (the image's tokens counted in `usage.prompt_tokens` alike).

Deployed on the default gateway beside the llama.cpp `tiny-vlm`, not this folder's vLLM gateway, so
only its own EngineCore starts: `client` is overridden here to reach that gateway."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.admin import deployed
from tests.support.gateway import GatewayProcess
from tests.support.suites.vision import (  # noqa: F401
    RED,
    _chat,
    chat_content,
    test_different_images_give_different_greedy_answers,
    test_images_count_in_prompt_tokens,
)
from tests.support.vision import tiny_vlm, vlm_spec
from tests.support.vllm import CPU_ENV


@pytest.fixture(scope="module")
def client(default_gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as c:
        yield c


@pytest.fixture(scope="module")
def vlm(vllm_setup: None, default_gateway: GatewayProcess) -> Iterator[str]:
    spec = vlm_spec(
        name="tiny-vlm-vllm",
        backend="vllm",
        source={"path": tiny_vlm()["hf"]},
        vision={"max_images": 8},
        num_cpus=1,
        engine={"max_model_len": 2048, "enforce_eager": True, "limit_mm_per_prompt": {"image": 8}},
        env=CPU_ENV,
    )
    with deployed(default_gateway.url, spec, timeout=900) as name:
        yield name


@pytest.fixture(scope="module")
def vlm_llama(default_gateway: GatewayProcess) -> Iterator[str]:
    with deployed(default_gateway.url, vlm_spec(name="tiny-vlm-llama")) as name:
        yield name


def test_same_prompt_layout_as_llama_cpp(client: openai.OpenAI, vlm: str, vlm_llama: str) -> None:
    """The same request costs the same prompt tokens on both engines: same template, same tiles."""
    for content in (chat_content(), chat_content(RED)):
        on_vllm = _chat(client, vlm, content, max_tokens=1).usage.prompt_tokens
        on_llama = _chat(client, vlm_llama, content, max_tokens=1).usage.prompt_tokens
        assert on_vllm == on_llama
