"""Which engine class serves which `backend:` value. Engine libraries are imported lazily, inside
the replica, so the gateway process never loads them."""

from __future__ import annotations

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
            engine_kwargs=config.engine,
            num_gpus=config.num_gpus,
            reasoning=config.reasoning,
            lora=bool(config.adapters),
        )
    if (
        config.backend == "llama_cpp"
        and config.task == "generate"
        and int(config.engine.get("n_seq_max", 1)) > 1
    ):
        from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine

        return BatchedLlamaCppEngine(str(path), engine_kwargs=config.engine, reasoning=config.reasoning)
    if config.backend == "llama_cpp":
        from raygate.backends.engines.llama_cpp.engine import LlamaCppEngine

        return LlamaCppEngine(
            str(path),
            embedding=config.task == "embed",
            rank=config.task == "rerank",
            engine_kwargs=config.engine,
            reasoning=config.reasoning,
        )
    raise ValueError(f"unknown backend {config.backend!r}")
