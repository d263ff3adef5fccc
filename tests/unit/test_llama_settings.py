"""`engine:` settings → `Llama(...)` arguments: the generation defaults (flash attention with a
Q8_0 V cache, which keeps the prompt cache's greedy guarantee: tests/engine/test_prompt_cache.py),
KV-cache types by llama-server's names, and keys `Llama` would silently ignore refused by name."""

from __future__ import annotations

import inspect

import pytest
from llama_cpp import Llama

from raygate.backends.engines.llama_cpp.model import llama_kwargs
from raygate.backends.engines.llama_cpp.options import RAYGATE_KEYS, llama_parameters


def test_generation_gets_flash_attention_with_a_q8_0_v_cache() -> None:
    kwargs, _ = llama_kwargs({}, generation=True)
    assert kwargs["flash_attn"] is True
    assert kwargs["type_v"] == 8  # GGML_TYPE_Q8_0
    assert "type_k" not in kwargs  # K stays llama.cpp's F16


def test_embeddings_keep_llama_cpp_defaults() -> None:
    kwargs, _ = llama_kwargs({"n_ctx": 512}, generation=False)
    assert "flash_attn" not in kwargs and "type_v" not in kwargs


def test_without_flash_attention_the_v_cache_stays_f16() -> None:
    # llama.cpp refuses a quantized V cache without flash attention
    kwargs, _ = llama_kwargs({"flash_attn": False}, generation=True)
    assert kwargs["flash_attn"] is False
    assert "type_v" not in kwargs


@pytest.mark.parametrize(("given", "number"), [("f16", 1), ("Q8_0", 8), ("bf16", 30), (1, 1)])
def test_kv_cache_types_by_name_or_number(given: str | int, number: int) -> None:
    kwargs, _ = llama_kwargs({"type_v": given, "type_k": given}, generation=True)
    assert kwargs["type_v"] == kwargs["type_k"] == number


@pytest.mark.parametrize("bad", ["q9_0", 99, True, None, 8.0])
def test_an_unknown_kv_cache_type_names_the_key(bad: object) -> None:
    with pytest.raises(ValueError, match=r"engine\.type_k must be one of f32, f16"):
        llama_kwargs({"type_k": bad}, generation=True)


def test_the_names_read_from_source_are_the_installed_llamas_parameters() -> None:
    params = inspect.signature(Llama.__init__).parameters.values()
    named = {p.name for p in params if p.kind is not p.VAR_KEYWORD} - {"self"}
    assert llama_parameters() == named and "n_ctx" in named and "type_k" in named


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"n_ctxx": 4096}, r"unknown llama\.cpp engine option `n_ctxx` \(did you mean `n_ctx`\?\)"),
        ({"n_ctx": 512, "zzz": 1}, r"unknown llama\.cpp engine option `zzz`$"),
        ({"model_path": "/x.gguf"}, r"`model_path` is set by Raygate"),
        ({"embedding": True}, r"`embedding` is set by Raygate"),
    ],
)
def test_a_key_llama_would_ignore_is_refused_by_name(engine: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llama_kwargs(engine, generation=True)


def test_llamas_own_keys_and_raygates_are_taken() -> None:
    engine = {"n_gpu_layers": 0, "use_mmap": True, "n_ubatch": 256, "prompt_cache": False}
    kwargs, cache = llama_kwargs(engine, generation=True)
    assert kwargs["n_ubatch"] == 256 and not cache.enabled
    assert {"prompt_cache", "prompt_cache_ram_mib", "chat_template", "n_seq_max"} <= RAYGATE_KEYS
