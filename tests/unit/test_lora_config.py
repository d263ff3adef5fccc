"""A model's `adapters:` (docs/lora.md): what the config refuses before anything loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from raygate.backends.engines.model_files import ModelFileError, resolve_adapter
from raygate.protocol.config import GatewayConfig, ModelConfig
from raygate.protocol.model_source import ModelSource
from raygate.server.access.admin_auth import is_admin_path

SOURCE = {"path": "/models/base.gguf"}


def _model(name: str = "base", **extra: Any) -> dict[str, Any]:
    return {"name": name, "source": SOURCE, **extra}


def _adapter(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "source": {"path": f"/models/{name}.gguf"}, **extra}


def test_adapters_are_part_of_the_spec() -> None:
    spec = ModelConfig.model_validate(_model(adapters=[_adapter("a"), _adapter("b", scale=0.5)]))
    assert [(a.name, a.scale) for a in spec.adapters] == [("a", 1.0), ("b", 0.5)]
    assert ModelConfig.model_validate(spec.model_dump()) == spec  # registry.json round trip


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"adapters": [_adapter("a"), _adapter("a")]}, "`a`"),
        ({"aliases": ["x"], "adapters": [_adapter("x")]}, "`x`"),
        ({"adapters": [_adapter("bad name")]}, "bad name"),
        ({"adapters": [_adapter("a", scale=float("nan"))]}, "scale"),
        ({"backend": "synthetic", "adapters": [_adapter("a")]}, "llama_cpp"),
        (
            {"backend": "vllm", "adapters": [_adapter("a", scale=0.5)]},
            "`a`: vLLM applies adapters at `scale` 1.0",
        ),
        ({"task": "embed", "adapters": [_adapter("a")]}, "generate"),
    ],
)
def test_bad_adapters_are_refused_by_name(extra: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        ModelConfig.model_validate(_model(**extra))


def test_which_models_take_adapters_at_run_time() -> None:
    def takes(**extra: Any) -> bool:
        return ModelConfig.model_validate(_model(**extra)).takes_adapters

    assert takes() and takes(adapters=[_adapter("a")])
    assert not takes(task="embed")
    # vLLM: only an engine started with LoRA on (its `--enable-lora`), which `adapters:` implies.
    assert takes(backend="vllm", adapters=[_adapter("a")])
    assert takes(backend="vllm", engine={"enable_lora": True})
    assert not takes(backend="vllm")


def test_an_adapter_name_is_a_model_id_of_the_whole_config() -> None:
    with pytest.raises(ValidationError, match="`other` is used twice"):
        GatewayConfig.model_validate({"models": [_model(adapters=[_adapter("other")]), _model("other")]})


def test_vllms_lora_endpoints_want_the_admin_key() -> None:
    assert is_admin_path("POST", "/v1/load_lora_adapter")
    assert is_admin_path("POST", "/v1/unload_lora_adapter")
    assert not is_admin_path("POST", "/v1/chat/completions")


def test_an_adapter_is_a_gguf_file_for_llama_cpp_and_a_peft_folder_for_vllm(tmp_path: Path) -> None:
    gguf = tmp_path / "a.gguf"
    gguf.write_bytes(b"GGUF")
    peft = tmp_path / "a-peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text("{}")
    assert resolve_adapter(ModelSource(path=str(gguf)), "llama_cpp") == gguf
    assert resolve_adapter(ModelSource(path=str(peft)), "vllm") == peft
    with pytest.raises(ModelFileError, match=r"no adapter_config\.json"):
        resolve_adapter(ModelSource(path=str(gguf)), "vllm")
    with pytest.raises(ModelFileError, match="not found"):
        resolve_adapter(ModelSource(path=str(peft)), "llama_cpp")


def test_max_loras_is_one_setting_for_both_engines() -> None:
    llama = ModelConfig.model_validate(_model(lora={"max_loras": 2}, adapters=[_adapter("a")]))
    assert llama.lora.max_loras == 2
    assert ModelConfig.model_validate(llama.model_dump()) == llama  # registry.json round trip
    vllm = _model(backend="vllm", lora={"max_loras": 3}, engine={"max_loras": 3})
    assert ModelConfig.model_validate(vllm).lora.max_loras == 3  # the same value twice is one
    with pytest.raises(ValidationError, match="differ"):
        ModelConfig.model_validate(_model(backend="vllm", lora={"max_loras": 3}, engine={"max_loras": 2}))
    with pytest.raises(ValidationError, match="max_loras"):
        ModelConfig.model_validate(_model(task="embed", lora={"max_loras": 1}))
    with pytest.raises(ValidationError, match="max_loras"):
        ModelConfig.model_validate(_model(lora={"max_loras": 0}))
