"""server/serving/lora_choice.py: a request's `lora` list (llama-server's shape) against its model's
adapters: by id or name, scale 0 dropped, refusals naming the entry, vLLM's scale 1.0 only."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from raygate.protocol.chat import ChatCompletionRequest
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.server.serving.lora_choice import request_lora


def _model(backend: str = "llama_cpp") -> ModelConfig:
    adapters = [{"name": n, "source": {"path": f"/a/{n}"}} for n in ("ad-a", "ad-b")]
    return ModelConfig.model_validate(
        {"name": "base", "backend": backend, "source": {"path": "/m"}, "adapters": adapters}
    )


def _lora(body: list[dict[str, Any]] | None) -> Any:
    return ChatCompletionRequest.model_validate(
        {"model": "base", "messages": [{"role": "user", "content": "hi"}], "lora": body}
    ).lora


def test_the_list_replaces_the_model_names_adapter() -> None:
    config = _model()
    a = config.adapters[0]
    assert request_lora(config, None, None) == ()
    assert request_lora(config, a, None) == (("ad-a", 1.0),)
    assert request_lora(config, a, _lora([])) == ()  # an empty list: the base model alone
    both = _lora([{"id": 1, "scale": 0.5}, {"name": "ad-a", "scale": 2}])
    assert request_lora(config, None, both) == (("ad-b", 0.5), ("ad-a", 2.0))
    assert request_lora(config, a, _lora([{"id": 0, "scale": 0}])) == ()  # scale 0: not applied


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([{"id": 2, "scale": 1}], "lora[0].id"),
        ([{"name": "nope"}], "lora[0].name"),
        ([{"id": 0}, {"name": "ad-a"}], "lora"),
    ],
)
def test_bad_entries_are_refused_by_name(body: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        request_lora(_model(), None, _lora(body))
    assert caught.value.param == param


def test_vllm_takes_scale_one_or_zero_only() -> None:
    config = _model("vllm")
    assert request_lora(config, None, _lora([{"id": 0, "scale": 1}, {"id": 1, "scale": 0}])) == (
        ("ad-a", 1.0),
    )
    with pytest.raises(BadRequestError, match=r"scale 1\.0 only") as caught:
        request_lora(config, None, _lora([{"id": 1, "scale": 0.5}]))
    assert caught.value.param == "lora[0].scale"


@pytest.mark.parametrize(
    "entry", [{"scale": 1}, {"id": 0, "name": "ad-a"}, {"id": -1}, {"id": 0, "scale": 1e9}]
)
def test_malformed_entries_fail_validation(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _lora([entry])
