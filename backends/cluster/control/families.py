"""What one Xinference registration is, and the built-in ones Raygate derives from its default models.

A registration pairs a model type with a family (protocol/xinference.py `ModelFamily`). The store
that keeps, persists and launches them (registrations.py) takes families from two places: users
(`POST /v1/model_registrations`) and the default models found on this node. The second is a
translation of its own, from a model file's name to a family (its quantization and size read off
the GGUF name, an embedding model also offered as a cosine `rerank` family), and lives here so the
store does not carry it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from raygate.backends.engines.model_files import ModelFileError, resolve_model_file
from raygate.protocol.config import ModelConfig
from raygate.protocol.xinference import MODEL_TYPE_TASK, TASK_ABILITY, TASK_MODEL_TYPE, ModelFamily, ModelSpec

_QUANT = re.compile(r"\.((?:I?Q\d[A-Za-z0-9_]*)|F16|F32|BF16)\.gguf$", re.IGNORECASE)
_SIZE = re.compile(r"(?<![A-Za-z0-9])(\d+(?:\.\d+)?)([MB])(?![A-Za-z])", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Registration:
    """One registered family: its type, and for a built-in the default model's spec (its source and
    engine options) that a launch starts from."""

    model_type: str
    family: ModelFamily
    persist: bool = False
    base: ModelConfig | None = None

    @property
    def builtin(self) -> bool:
        return self.base is not None

    def wire(self, detailed: bool) -> dict[str, Any]:
        """`GET /v1/model_registrations/{type}` answers names only unless `detailed`; the family
        itself is what `GET .../{type}/{name}` answers."""
        if not detailed:
            return {"model_name": self.family.model_name, "is_builtin": self.builtin}
        return {**self.family.model_dump(mode="json"), "is_builtin": self.builtin}


def builtin_registrations(spec: ModelConfig) -> list[Registration]:
    """A default model as built-in families (none when its weights are not on this node): its own
    type's, and for an embedding model also a `rerank` one (`cosine_rerank_family`)."""
    if spec.source is None or spec.backend not in ("llama_cpp", "vllm") or spec.task not in TASK_MODEL_TYPE:
        return []
    try:
        path = resolve_model_file(spec.source, folder=spec.backend == "vllm")
    except ModelFileError:
        return []
    quant = _QUANT.search(path.name)
    size = _SIZE.search(path.name)
    n_ctx = spec.engine.get("n_ctx")
    family = ModelFamily(
        model_name=spec.name,
        context_length=n_ctx if isinstance(n_ctx, int) else None,
        model_lang=["en"],
        model_ability=TASK_ABILITY[spec.task],
        model_description=f"Raygate default model: {path.name}.",
        model_specs=[
            ModelSpec(
                model_format="ggufv2" if spec.backend == "llama_cpp" else "pytorch",
                model_size_in_billions=_size_label(size) if size else None,
                quantizations=[quant.group(1)] if quant else [""],
                model_id=f"{spec.source.package}/{spec.source.file}" if spec.source.package else None,
                model_file_name_template=(
                    path.name.replace(quant.group(1), "{quantization}") if quant else path.name
                )
                if spec.backend == "llama_cpp"
                else None,
                model_hub="local",
                model_uri=str(path if spec.backend == "vllm" else path.parent),
            )
        ],
    )
    regs = [Registration(TASK_MODEL_TYPE[spec.task], family, base=spec)]
    if spec.task == "embed" and "rerank" in MODEL_TYPE_TASK:
        regs.append(Registration("rerank", cosine_rerank_family(family, path.name), base=spec))
    return regs


def cosine_rerank_family(embedding: ModelFamily, file_name: str) -> ModelFamily:
    """The embedding model as Xinference's `rerank` type, under the same name. Raygate's rerank on
    an embedding model scores by the cosine similarity of the two texts' vectors (docs/api/rerank.md):
    a bi-encoder, not the cross-encoder Xinference's rerank families are, and the
    description says so. Launched, it is the same `task: embed` deployment; its `origin` says
    `rerank`, so Xinference's client hands out its rerank handle for it."""
    return embedding.model_copy(
        update={
            "model_ability": ["rerank"],
            "model_description": (
                f"Raygate default embedding model ({file_name}) reranking by the cosine similarity "
                "of query and document embeddings (a bi-encoder, not a cross-encoder): scores in [-1, 1]."
            ),
        }
    )


def _size_label(match: re.Match[str]) -> str | int:
    """`135M` -> "0_135", `7B` -> 7: Xinference writes fractional sizes with `_`."""
    value = float(match.group(1)) / (1000 if match.group(2).upper() == "M" else 1)
    return int(value) if value == int(value) else f"{value:g}".replace(".", "_")
