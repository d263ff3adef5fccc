"""`GET /v1/models`, `GET /v1/models/{id}` and `GET /health`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from backends.registry import ModelRegistry
from protocol.models import ModelCard, ModelList

router = APIRouter()


def _registry(request: Request) -> ModelRegistry:
    registry: ModelRegistry = request.app.state.registry
    return registry


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    registry = _registry(request)
    return ModelList(data=[ModelCard(id=i, created=registry.created) for i in registry.model_ids()])


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> ModelCard:
    registry = _registry(request)
    registry.get(model_id)  # raises ModelNotFoundError -> 404 model_not_found
    return ModelCard(id=model_id, created=registry.created)


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
