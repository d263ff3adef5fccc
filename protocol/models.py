"""`GET /v1/models` and `GET /v1/models/{id}`."""

from __future__ import annotations

from typing import Literal

from protocol.base import ResponseModel


class ModelCard(ResponseModel):
    """One id in `GET /v1/models`, in OpenAI's shape. Aliases get cards of their own; `created` is when this
    gateway started, not when the model was deployed."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "raygate"


class ModelList(ResponseModel):
    """OpenAI's list envelope for `GET /v1/models`: only the ids the caller's API key may use."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
