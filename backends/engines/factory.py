"""Which engine class serves which `backend:` value. Engine libraries are imported lazily, inside
the replica, so the gateway process never loads them."""

from __future__ import annotations

from typing import Any

from raygate.backends.engines.base import Engine
from raygate.backends.engines.model_files import resolve_model_file
from raygate.protocol.config import ModelConfig


def make_engine(config: ModelConfig) -> Engine:
    if config.backend == "synthetic":
        from raygate.backends.engines.synthetic.engine import SyntheticEngine

        return SyntheticEngine(config.engine)
    if config.source is None:
        raise ValueError(f"model `{config.name}` has no `source`")
    path = resolve_model_file(config.source, folder=config.backend == "vllm")
    if config.backend == "vllm":
        from raygate.backends.engines.vllm.engine import VllmEngine

        return VllmEngine(
            str(path),
            embedding=config.task == "embed",
            rank=config.task == "rerank",
            # `lora.max_loras` is vLLM's own `max_loras` (protocol/config.py refuses two values).
            engine_kwargs=_with(config.engine, max_loras=config.lora.max_loras),
            num_gpus=config.num_gpus,
            reasoning=config.reasoning,
            lora=bool(config.adapters),
            vision=config.vision is not None,
            name=config.name,
        )
    projector = _projector(config)
    if (
        config.backend == "llama_cpp"
        and config.task == "generate"
        and (int(config.engine.get("n_seq_max", 1)) > 1 or projector is not None)
    ):
        # A vision model always takes the batched engine, whose decoder evaluates images.
        from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine

        return BatchedLlamaCppEngine(
            str(path),
            engine_kwargs=config.engine,
            reasoning=config.reasoning,
            projector=projector,
            name=config.name,
            max_loras=config.lora.max_loras,
        )
    if config.backend == "llama_cpp":
        from raygate.backends.engines.llama_cpp.engine import LlamaCppEngine

        return LlamaCppEngine(
            str(path),
            embedding=config.task == "embed",
            rank=config.task == "rerank",
            engine_kwargs=config.engine,
            reasoning=config.reasoning,
            name=config.name,
            max_loras=config.lora.max_loras,
        )
    raise ValueError(f"unknown backend {config.backend!r}")


def _with(kwargs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """`kwargs` with the `extra` keys that are set (not None)."""
    return {**kwargs, **{k: v for k, v in extra.items() if v is not None}}


def _projector(config: ModelConfig) -> str | None:
    """A llama.cpp vision model's mmproj file (`vision.projector`), found as the model's own file
    is; vLLM reads its vision tower from the model folder."""
    if config.vision is None or config.backend != "llama_cpp":
        return None
    if config.vision.projector is None:
        raise ValueError(f"model `{config.name}`: llama.cpp needs `vision.projector` (the mmproj GGUF)")
    if config.task != "generate":
        raise ValueError(f"model `{config.name}`: `vision` is for generating models")
    return str(resolve_model_file(config.vision.projector))
