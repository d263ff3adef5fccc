"""vLLM's `add_lora` loads an adapter of a smaller base without complaint (it copies the matrices
into the corner of buffers sized for its own base): Raygate compares the adapter's tensor shapes,
read from its safetensors header, with the base model's config first (issue 49: an adapter of
another base is refused by name). The adapters here are real safetensors files, written with the
`safetensors` writer that peft uses; the configs are transformers' own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from raygate.backends.engines.vllm.lora import base_shapes, check_base
from raygate.protocol.errors import BadRequestError

SMOLLM2 = LlamaConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
)


def _adapter(folder: Path, hidden: int, inter: int, heads: int, kv: int, layers: int, rank: int = 8) -> Path:
    head_dim = hidden // heads
    dims = {
        "self_attn.q_proj": (hidden, heads * head_dim),
        "self_attn.k_proj": (hidden, kv * head_dim),
        "self_attn.v_proj": (hidden, kv * head_dim),
        "self_attn.o_proj": (heads * head_dim, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    tensors = {}
    for layer in range(layers):
        for module, (n_in, n_out) in dims.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.zeros(rank, n_in)
            tensors[f"{prefix}.lora_B.weight"] = torch.zeros(n_out, rank)
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_the_shapes_follow_from_the_config() -> None:
    shapes = base_shapes(SMOLLM2)
    assert shapes["q_proj"] == (576, 576) and shapes["k_proj"] == (576, 192)
    assert shapes["down_proj"] == (1536, 576)
    assert base_shapes(object()) == {}  # a config that says nothing: nothing to check


def test_an_adapter_of_this_base_passes(tmp_path: Path) -> None:
    check_base("mine", _adapter(tmp_path / "a", 576, 1536, 9, 3, layers=2), SMOLLM2)


def test_an_adapter_of_another_base_is_refused_by_name(tmp_path: Path) -> None:
    folder = _adapter(tmp_path / "a", 64, 128, 4, 2, layers=2)
    with pytest.raises(BadRequestError, match="`other-base` was made for another base model") as caught:
        check_base("other-base", folder, SMOLLM2)
    assert caught.value.param == "lora_path"


def test_an_adapter_with_more_layers_than_the_base_is_refused(tmp_path: Path) -> None:
    small = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
    )
    with pytest.raises(BadRequestError, match=r"`deep`.*layer 2, this model 2 layers"):
        check_base("deep", _adapter(tmp_path / "a", 576, 1536, 9, 3, layers=3), small)


def test_what_cannot_be_read_is_left_to_vllm(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    check_base("no-weights", tmp_path / "empty", SMOLLM2)  # vLLM refuses the folder itself
    (tmp_path / "empty" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    check_base("garbled", tmp_path / "empty", SMOLLM2)
