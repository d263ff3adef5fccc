"""The LoRA suite (tests/support/suites/lora.py) on llama.cpp, served from examples/lora.yaml as a
user would: GGUF adapters, its own gateway with an admin key and a state directory (so the suite
also checks the admin key and that run-time loads persist in the registry). One change: the model
holds one adapter at a time (`lora: {max_loras: 1}`), so every test also runs through loading on
first use and eviction, and concurrent requests for two adapters take turns. The adapters are
random ones built once per machine (tests/support/lora.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from tests.support.gateway import REPO, start_gateway
from tests.support.lora import LoraGateway, build_adapters
from tests.support.release import stop_and_release
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

NAMESPACE = "raygate-lora-test"
ADMIN_KEY = "lora-admin-s3cret"


@pytest.fixture(scope="module")
def adapters() -> dict[str, Path]:
    return build_adapters()


@pytest.fixture(scope="module")
def lora_gateway(
    ray_address: str, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoraGateway]:
    tmp = tmp_path_factory.mktemp("lora")
    state_dir = tmp / "state"
    config = yaml.safe_load((REPO / "examples" / "lora.yaml").read_text())
    config["models"][0]["lora"] = {"max_loras": 1}
    (tmp / "lora.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    args = ["--config", str(tmp / "lora.yaml"), "--ray-address", ray_address]
    args += ["--ray-namespace", NAMESPACE, "--state-dir", str(state_dir), "--admin-key", ADMIN_KEY]
    gw = start_gateway(args, tmp / "gateway.log")
    try:
        yield LoraGateway(gw.url, ADMIN_KEY, state_dir)
    finally:
        code = stop_and_release(gw, NAMESPACE, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert code == 0, gw.log()[-3000:]


@pytest.fixture(scope="module")
def lclient(lora_gateway: LoraGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{lora_gateway.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def admin_client(lora_gateway: LoraGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{lora_gateway.url}/v1", api_key=ADMIN_KEY, max_retries=0) as c:
        yield c
