"""The LoRA suite (tests/support/suites/lora.py), which tests/e2e/test_lora.py runs on llama.cpp,
rerun on vLLM: the session's vLLM gateway serves its chat model as examples/lora-vllm.yaml declares
it (LoRA on, the two adapters as PEFT folders; tests/support/vllm.py's `session_config`), so no
third EngineCore starts for it. That gateway has no admin key (its `/admin` is open) and no state
directory: the admin key and the registry's persistence are checked on llama.cpp only, where they
are the same gateway code."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.support.lora import LoraGateway, build_adapters, peft_folders
from tests.support.suites.lora import (  # noqa: F401
    test_adapters_take_turns_beyond_max_loras,
    test_an_adapter_changes_the_answer_on_every_endpoint,
    test_bad_adapter_requests_are_refused_by_name,
    test_load_and_unload_at_run_time,
    test_metrics_per_adapter,
    test_mixed_adapters_at_once_each_get_their_own,
    test_models_list_adapters_with_their_parent,
    test_per_request_lora_scales_as_llama_server_takes_them,
    test_the_cli_loads_and_unloads,
)
from tests.support.vllm import VllmDeployment


@pytest.fixture(scope="module")
def adapters() -> dict[str, Path]:
    return peft_folders(build_adapters())


@pytest.fixture(scope="module")
def lora_gateway(vllm: VllmDeployment) -> LoraGateway:
    return LoraGateway(vllm.process.url)


@pytest.fixture(scope="module")
def lclient(client: openai.OpenAI) -> openai.OpenAI:
    return client


@pytest.fixture(scope="module")
def admin_client(client: openai.OpenAI) -> openai.OpenAI:
    return client
