"""`tiny-reasoner` on the vLLM engine (its Hugging Face folder, tests/support/reasoning.py): the
same chat suite as on llama.cpp (tests/support/suites/reasoning.py), through the same template
rendering and parser, with the thinking budget enforced by vLLM's own sampler (its
`thinking_token_budget`, the markers named in the engine's `reasoning_config`), grammars held
until the end marker by vLLM's structured-output manager, and an end of turn while thinking made
the end marker by Raygate's logits processor (backends/engines/vllm/thinking_end.py).

Deployed on the default gateway, not this folder's vLLM gateway, so only its own EngineCore
starts: `client` is overridden here to reach that gateway."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.admin import deployed
from tests.support.gateway import GatewayProcess
from tests.support.reasoning import reasoner_spec, tiny_reasoner_hf
from tests.support.suites.reasoning import (  # noqa: F401
    test_a_small_budget_leaves_room_for_an_answer,
    test_ending_the_turn_while_thinking_gives_the_end_marker,
    test_forced_tool_call_after_the_thinking,
    test_include_reasoning_false_hides_the_thinking,
    test_json_schema_applies_after_the_thinking,
    test_no_end_marker_before_max_tokens_is_all_thinking,
    test_stream_carries_the_same_split,
    test_thinking_off,
    test_thinking_split_from_the_answer,
)
from tests.support.vllm import CPU_ENV


@pytest.fixture(scope="module")
def client(default_gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{default_gateway.url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as c:
        yield c


@pytest.fixture(scope="module")
def reasoner(vllm_setup: None, default_gateway: GatewayProcess) -> Iterator[str]:
    spec = reasoner_spec(
        backend="vllm",
        source={"path": tiny_reasoner_hf()},
        num_cpus=1,
        engine={"max_model_len": 1024, "enforce_eager": True},
        env=CPU_ENV,
    )
    with deployed(default_gateway.url, spec, timeout=900) as name:
        yield name
