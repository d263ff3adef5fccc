"""`GET /v1/models` and `GET /v1/models/{id}`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_serializer

from raygate.protocol.base import ResponseModel
from raygate.protocol.config import Task


class ModelCard(ResponseModel):
    """One id in `GET /v1/models`, in OpenAI's shape. Aliases get cards of their own; `created` is when this
    gateway started, not when the model was deployed."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "raygate"
    # Which kind of model (Raygate's field; OpenAI's clients ignore it): `generate` (chat and
    # completions), `embed` (embeddings, and rerank/score by cosine similarity) or `rerank` (a
    # cross-encoder: rerank and score). Absent where a caller builds a card without it.
    task: Task | None = None
    # On `GET /v1/models/{id}` of a generating model: the request fields beyond OpenAI's it
    # honours (vLLM's extensions, protocol/extensions.py) and the deployment's `defaults:`.
    sampling_parameters: list[str] | None = None
    sampling_defaults: dict[str, Any] | None = None
    # A LoRA adapter's base model (vLLM's field): the deployment it runs on. Absent for models.
    parent: str | None = None
    # Raygate's field: true for a model that reads images (its `vision:` block, docs/vision.md);
    # absent for a text-only one. The web console shows its image picker by it.
    vision: bool | None = None

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: Any) -> dict[str, Any]:
        """Absent, not null, where they do not apply (lists, embedding models)."""
        data: dict[str, Any] = handler(self)
        for key in ("task", "sampling_parameters", "sampling_defaults", "parent", "vision"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class ModelList(ResponseModel):
    """OpenAI's list envelope for `GET /v1/models`: only the ids the caller's API key may use."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoraAdapterEntry(ResponseModel):
    """One adapter in `GET /lora-adapters` (llama-server's list, with the model it belongs to):
    a request's `lora: [{"id": ..., "scale": ...}]` names it by `id`, its place on its model."""

    id: int
    name: str
    path: str
    scale: float
    model: str
