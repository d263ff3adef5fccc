"""Session fixtures of the end-to-end tier: one Ray cluster, one gateway process with the default
models, shared by all tests (each Ray start costs ~8 s and each model load a few seconds on 2
cores); the operations gateway (tests/support/ops.py) beside it. Everything under tests/e2e is
marked `e2e`."""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import ray

from raygate.backends.cluster.runtime import connection
from raygate.backends.cluster.runtime.connection import NAMESPACE
from tests.support import postmortem
from tests.support.admin import deployed
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.models import DEFAULT_CONFIG

# The operations tests' own gateway (keys, limits, fault-injection models).
from tests.support.ops import admin, ops_gateway  # noqa: F401
from tests.support.reasoning import harmony_spec, reasoner_spec

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """A local Ray cluster owned by the test session (8 logical CPUs on 2 cores: the default, ops
    and vLLM gateways' replicas plus what the lifecycle tests deploy must all fit at once); the gateway attaches to it like it would to
    a production cluster, and tests can reach the replica actors to observe the engines."""
    # start_local: as `raygate serve`'s embedded Ray (replicas at nice 0, retried starts).
    # A GCS starved for a minute on a busy box must fail the tests that needed it, not abort this
    # process (Ray's driver calls abort() after 60 s without its GCS: no summary, no clue).
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")
    context = connection.start_local(num_cpus=8, namespace=NAMESPACE, log_to_driver=False)
    _collect_ray_start_leftovers()
    postmortem.record(ray_session=context.address_info["session_dir"])
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _collect_ray_start_leftovers() -> None:
    """On a busy box Ray's start can drop a `Popen` handle of a process it started (seen after
    its 'Failed to get node info ... Deadline Exceeded' retry); collected later, its ResourceWarning
    (an error here) fails whichever test is running. Collect it now, where it belongs: Ray's
    start, not a test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture(scope="session")
def default_gateway(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The gateway serving models/default.yaml; a folder's conftest may point `gateway` elsewhere
    (tests/e2e/vllm does) and still reach this one by name."""
    log_path = tmp_path_factory.mktemp("gateway") / "gateway.log"
    # Image URLs from loopback: the vision tests' own image server (and, listed by name, a host
    # that resolves to a private address, which the gateway must still refuse).
    fetch = ["--image-fetch-domain", "127.0.0.1", "--image-fetch-domain", "localhost"]
    gw = start_gateway(["--config", str(DEFAULT_CONFIG), "--ray-address", ray_address, *fetch], log_path)
    yield gw
    code = gw.stop()
    assert code == 0, f"gateway exited with {code}:\n{gw.log()[-4000:]}"


@pytest.fixture(scope="session")
def gateway(default_gateway: GatewayProcess) -> GatewayProcess:
    return default_gateway


@pytest.fixture(scope="session")
def base_url(gateway: GatewayProcess) -> str:
    return f"{gateway.url}/v1"


@pytest.fixture(scope="session")
def backend() -> str:
    """The backend serving `gateway`'s models, as error messages name it (the vLLM folder
    overrides it, with `gateway`)."""
    return "llama_cpp"


@pytest.fixture(scope="session")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture
def langchain_http() -> Iterator[dict[str, Any]]:
    """The `http_client` for a LangChain model, closed after the test: LangChain's own clients
    are cached for the whole process and closed by nobody. (The tests make sync calls only; the
    async client LangChain makes on its own never opens a connection.)"""
    with httpx.Client(timeout=120) as sync:
        yield {"http_client": sync}


@pytest.fixture(scope="session")
async def async_client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def anthropic_client(gateway: GatewayProcess) -> Iterator[anthropic.Anthropic]:
    """The SDK as an agent would configure it from ANTHROPIC_BASE_URL (the gateway's root): the
    module's `gateway`, so tests/e2e/vllm's override makes it the vLLM gateway's there."""
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def reasoner(gateway: GatewayProcess) -> Iterator[str]:
    """`tiny-reasoner` (tests/support/reasoning.py) deployed beside the default models for the
    module (the reasoning tests, Ollama's `think`); tests/e2e/vllm's modules deploy their own."""
    with deployed(gateway.url, reasoner_spec()) as name:
        yield name


@pytest.fixture(scope="module")
def harmony(gateway: GatewayProcess) -> Iterator[str]:
    """`tiny-harmony` (gpt-oss's channels, tests/support/reasoning.py) beside the default models
    for the module; tests/e2e/vllm's reasoning module deploys its own."""
    with deployed(gateway.url, harmony_spec()) as name:
        yield name
