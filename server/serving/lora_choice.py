"""The LoRA adapters a request decodes under: the adapter its `model` names, or its own `lora`
list (llama-server's shape: `[{"id": 0, "scale": 0.5}]`, or by `name`), which replaces it
(docs/lora.md). Checked here, before anything is admitted, so a bad entry is a 400 naming it."""

from __future__ import annotations

from collections.abc import Sequence

from raygate.protocol.common import LoraChoice
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.lora import AdapterConfig

LoraSet = tuple[tuple[str, float], ...]


def request_lora(
    config: ModelConfig, adapter: AdapterConfig | None, choices: Sequence[LoraChoice] | None
) -> LoraSet:
    """(adapter name, scale) pairs for the engine. A scale of 0 applies nothing: such an entry is
    dropped, so the request is the base model's (and cached as one)."""
    if choices is None:
        return ((adapter.name, adapter.scale),) if adapter is not None else ()
    adapters = config.adapters
    chosen: dict[str, float] = {}
    for i, choice in enumerate(choices):
        if choice.id is not None:
            if choice.id >= len(adapters):
                raise BadRequestError(
                    f"`lora[{i}].id` is {choice.id}: model `{config.name}` has {len(adapters)} LoRA "
                    "adapters (`GET /lora-adapters` lists them with their ids).",
                    param=f"lora[{i}].id",
                )
            found = adapters[choice.id]
        else:
            named = next((a for a in adapters if a.name == choice.name), None)
            if named is None:
                raise BadRequestError(
                    f"`lora[{i}].name`: model `{config.name}` has no LoRA adapter `{choice.name}`.",
                    param=f"lora[{i}].name",
                )
            found = named
        if found.name in chosen:
            raise BadRequestError(f"LoRA adapter `{found.name}` is listed twice in `lora`.", param="lora")
        if config.backend == "vllm" and choice.scale not in (0.0, 1.0):
            raise BadRequestError(
                f"`lora[{i}].scale` is {choice.scale}: vLLM applies LoRA adapter `{found.name}` at "
                "scale 1.0 only (0 leaves it out).",
                param=f"lora[{i}].scale",
            )
        chosen[found.name] = choice.scale
    return tuple((name, scale) for name, scale in chosen.items() if scale != 0.0)
