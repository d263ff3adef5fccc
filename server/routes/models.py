"""`GET /v1/models`, `GET /v1/models/{id}` and `GET /health`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from backends.cluster.controller_client import ControllerClient
from protocol.extensions import supported_extensions
from protocol.models import ModelCard, ModelList
from server.auth import check_model_access
from server.context import request_context

router = APIRouter()


def _cluster(request: Request) -> ControllerClient:
    cluster: ControllerClient = request.app.state.cluster
    return cluster


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    cluster = _cluster(request)
    key = request_context(request).key
    ids = [i for i in cluster.model_ids() if key is None or key.allows(cluster.get(i).config.ids)]
    return ModelList(
        data=[ModelCard(id=i, created=cluster.created, task=cluster.get(i).config.task) for i in ids]
    )


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> ModelCard:
    cluster = _cluster(request)
    router = cluster.get(model_id)  # raises ModelNotFoundError -> 404 model_not_found
    config = router.config
    check_model_access(request_context(request).key, config.ids)
    if config.task != "generate":
        return ModelCard(id=model_id, created=cluster.created, task=config.task)
    return ModelCard(
        id=model_id,
        created=cluster.created,
        task=config.task,
        sampling_parameters=supported_extensions(),
        sampling_defaults=config.defaults.model_dump(exclude_none=True),
    )


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
