"""`GET /v1/models` and `GET /v1/models/{id}`."""

from __future__ import annotations

from typing import Literal

from protocol.base import ResponseModel


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "raygate"


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
