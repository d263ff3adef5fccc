"""A model's `generation_config.json` as sampling defaults, read the way vLLM reads it, and the
order request > deployment `defaults:` > generation config. The file in the vLLM model folder that
`make vllm-setup` builds is checked where that setup is required: tests/e2e/vllm/test_vllm_config.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from raygate.backends.engines.model_files import ModelFileError, generation_defaults
from raygate.protocol.chat import ChatCompletionRequest
from raygate.protocol.config import ModelConfig
from raygate.protocol.sampling_defaults import SamplingDefaults

BUILT = Path("~/.cache/raygate/models").expanduser()


def vllm_folder(tmp_path: Path, generation: dict[str, object] | None) -> Path:
    """A model folder as models/build_vllm_models.py lays it out (its config.json when built
    here), with the given generation_config.json, or none."""
    folder = tmp_path / "model"
    folder.mkdir()
    built = sorted(BUILT.glob("smollm2-*/config.json"))
    if built:
        shutil.copy(built[0], folder / "config.json")
    else:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def vllm_model(folder: Path, **kw: str) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "backend": "vllm", "source": {"path": str(folder)}, **kw})


def test_keys_are_vllms_and_hugging_faces_defaults_say_nothing() -> None:
    got = SamplingDefaults.from_generation_config(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 50, "repetition_penalty": 1.0, "max_new_tokens": 512,
         "do_sample": True, "bos_token_id": 1, "min_p": None}
    )  # fmt: skip
    assert got.model_dump(exclude_none=True) == {"temperature": 0.6, "top_p": 0.95, "max_tokens": 512}
    with pytest.raises(ValidationError, match="temperature"):
        SamplingDefaults.from_generation_config({"temperature": 9})


def test_request_over_defaults_over_generation_config() -> None:
    recommended = SamplingDefaults(temperature=0.7, top_k=20, repetition_penalty=1.3)
    merged = SamplingDefaults(temperature=0.0, max_tokens=8).over(recommended)
    assert merged.model_dump(exclude_none=True) == {
        "temperature": 0.0,
        "top_k": 20,
        "repetition_penalty": 1.3,
        "max_tokens": 8,
    }
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "top_k": 5,
            "max_completion_tokens": 3,
        }
    )
    served = merged.under(body)
    assert (served.top_k, served.temperature, served.repetition_penalty) == (5, 0.0, 1.3)
    assert served.max_tokens is None and served.max_completion_tokens == 3  # either spelling wins


def test_auto_reads_the_vllm_folder(tmp_path: Path) -> None:
    folder = vllm_folder(tmp_path, {"temperature": 0.6, "top_k": 20, "eos_token_id": 2})
    assert generation_defaults(vllm_model(folder)) == {"temperature": 0.6, "top_k": 20}
    assert generation_defaults(vllm_model(folder, generation_config="none")) == {}


def test_auto_without_a_file_or_for_a_gguf_is_empty(tmp_path: Path) -> None:
    assert generation_defaults(vllm_model(vllm_folder(tmp_path, None))) == {}
    gguf = ModelConfig.model_validate({"name": "m", "source": {"path": str(tmp_path / "x.gguf")}})
    assert generation_defaults(gguf) == {}


def test_a_folder_path_works_for_any_backend_and_must_hold_the_file(tmp_path: Path) -> None:
    folder = vllm_folder(tmp_path, {"repetition_penalty": 1.1, "max_new_tokens": 64})
    gguf = {"name": "m", "source": {"path": str(tmp_path / "x.gguf")}}
    config = ModelConfig.model_validate({**gguf, "generation_config": str(folder)})
    assert generation_defaults(config) == {"repetition_penalty": 1.1, "max_tokens": 64}
    with pytest.raises(ModelFileError, match=r"no generation_config\.json"):
        generation_defaults(ModelConfig.model_validate({**gguf, "generation_config": str(tmp_path)}))
    (folder / "generation_config.json").write_text('{"top_p": 0}')
    with pytest.raises(ModelFileError, match="top_p"):
        generation_defaults(config)


def test_defaults_reach_endpoints_without_the_field() -> None:
    """The Responses API has no `repetition_penalty` (nor `max_tokens`): the default still applies
    to what it generates; its own `max_output_tokens` wins over the default budget."""
    from raygate.protocol.responses import CreateResponseRequest

    defaults = SamplingDefaults(repetition_penalty=1.1, max_tokens=40, temperature=0.5)
    for sent, budget in (({}, 40), ({"max_output_tokens": 20}, 20)):
        body = defaults.under(CreateResponseRequest.model_validate({"model": "m", "input": "hi", **sent}))
        params = body.to_sampling_params()
        defaults.beyond(body, params)
        assert (params.repetition_penalty, params.max_tokens, params.temperature) == (1.1, budget, 0.5)
