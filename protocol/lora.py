"""A model's LoRA adapters (docs/lora.md): the `adapters:` list and the `lora:` settings.

Its own room because an adapter is a model id of its own with its own weights, read by the
controller, the replicas and the serving layer (`/v1/load_lora_adapter`, the adapter choice); how
adapters fit their base model (backend, task, unique names) is checked by `ModelConfig` in
config.py, which holds both.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from raygate.protocol.base import StrictModel
from raygate.protocol.model_names import NAME_RE
from raygate.protocol.model_source import ModelSource


class AdapterConfig(StrictModel):
    """A LoRA adapter served on its model: clients send its `name` as `model` (docs/lora.md)."""

    name: str = Field(
        description="The id clients send as `model` for the base model with this adapter: like a "
        "model name, and unique among every model id and adapter of the gateway."
    )
    source: ModelSource = Field(
        description="The adapter's weights: a GGUF LoRA (llama.cpp, from llama.cpp's "
        "`convert_lora_to_gguf.py`) or a PEFT folder (vLLM)."
    )
    scale: float = Field(
        1.0,
        ge=-100,
        le=100,
        allow_inf_nan=False,
        description="How strongly it applies (llama.cpp's `--lora-scaled`); vLLM applies 1.0 only.",
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError(
                f"adapter name {value[:40]!r} must be like a model name (letters, digits, `._-`)"
            )
        return value


class LoraSettings(StrictModel):
    """How a model holds its LoRA adapters, one name for both engines (docs/lora.md)."""

    max_loras: int | None = Field(
        None,
        ge=1,
        le=256,
        description="LoRA adapters each replica holds at once. llama.cpp: any number may be "
        "registered; beyond this many, an adapter is read from its file on first use, evicting "
        "the least recently used one that no running request decodes under (requests wait while "
        "all are in use). vLLM: its own `max_loras` (adapters in one batch). Unset: llama.cpp "
        "keeps every adapter loaded, vLLM takes its default (1).",
    )
