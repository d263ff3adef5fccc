"""`tiny-harmony` (gpt-oss's channels, tests/support/reasoning.py) on the vLLM engine: the split
stream and not, and the thinking budget, enforced by vLLM's own sampler with harmony's multi-token
markers (the analysis channel's header, then `<|end|><|start|>assistant<|channel|>final<|message|>`
forced whole), then an answer; a json_schema grammar that waits for the final channel
(harmony_gate.py). The parser is `auto`: read from the folder's template before the engine
starts (its markers go into vLLM's reasoning config).

Its own module, so that its EngineCore does not run beside tiny-reasoner's; deployed on the
default gateway, as tests/e2e/vllm/test_vllm_reasoning.py does."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.admin import deployed
from tests.support.gateway import GatewayProcess
from tests.support.reasoning import harmony_spec, tiny_harmony_hf
from tests.support.suites.reasoning import (  # noqa: F401
    test_harmony_channels_split_stream_and_not,
    test_harmony_json_schema_after_the_thinking,
    test_harmony_thinking_cannot_be_turned_off,
)
from tests.support.vllm import CPU_ENV


@pytest.fixture(scope="module")
def client(default_gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as c:
        yield c


@pytest.fixture(scope="module")
def harmony(vllm_setup: None, default_gateway: GatewayProcess) -> Iterator[str]:
    spec = harmony_spec(
        backend="vllm",
        source={"path": tiny_harmony_hf()},
        num_cpus=1,
        engine={"max_model_len": 1024, "enforce_eager": True},
        env=CPU_ENV,
    )
    with deployed(default_gateway.url, spec, timeout=900) as name:
        yield name
