"""`GET /v1/models`, `GET /v1/models/{id}` (OpenAI's model object + Xinference's description) and
`GET /health`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.protocol.extensions import supported_extensions
from raygate.protocol.model_source import ModelSource
from raygate.protocol.models import LoraAdapterEntry, ModelCard, ModelList
from raygate.protocol.xinference import (
    ENGINE_FORMATS,
    ENGINE_OF_BACKEND,
    TASK_ABILITY,
    TASK_MODEL_TYPE,
    XinferenceModelCard,
)
from raygate.server.access.auth import check_model_access
from raygate.server.context import request_context

router = APIRouter()

FORMAT_OF_ENGINE = {engine: fmt for engine, (fmt, _) in ENGINE_FORMATS.items()}


def _cluster(request: Request) -> ControllerClient:
    cluster: ControllerClient = request.app.state.cluster
    return cluster


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    cluster = _cluster(request)
    key = request_context(request).key
    ids = [i for i in cluster.model_ids() if key is None or key.allows(cluster.get(i).config.ids)]
    return ModelList(
        data=[
            ModelCard(
                id=i,
                created=cluster.created,
                task=cluster.get(i).config.task,
                parent=_parent(cluster, i),
                vision=True if cluster.get(i).config.vision is not None else None,
            )
            for i in ids
        ]
    )


def _parent(cluster: ControllerClient, model_id: str) -> str | None:
    """The base model's name when `model_id` is a LoRA adapter (vLLM lists adapters so)."""
    return cluster.get(model_id).config.name if cluster.adapter(model_id) else None


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> XinferenceModelCard:
    """OpenAI's model object, and Xinference's description of it in the same body (its client reads
    `model_type` and `model_ability` here to pick a handle): from the launch's `origin`, or, for a
    deployment made otherwise, from its task and backend."""
    cluster = _cluster(request)
    router = cluster.get(model_id)  # raises ModelNotFoundError -> 404 model_not_found
    config = router.config
    check_model_access(request_context(request).key, config.ids)
    origin = config.origin
    engine = ENGINE_OF_BACKEND.get(config.backend, config.backend)
    generates = config.task == "generate"
    return XinferenceModelCard(
        id=model_id,
        created=cluster.created,
        task=config.task,
        vision=True if config.vision is not None else None,
        sampling_parameters=supported_extensions() if generates else None,
        sampling_defaults=router.sampling_defaults().model_dump(exclude_none=True) if generates else None,
        model_type=origin.model_type if origin else TASK_MODEL_TYPE.get(config.task, config.task),
        model_name=origin.model_name if origin else config.name,
        model_ability=origin.model_ability if origin else [*TASK_ABILITY.get(config.task, [])],
        model_lang=origin.model_lang if origin else ["en"],
        model_description=origin.model_description if origin else None,
        model_format=origin.model_format if origin else FORMAT_OF_ENGINE.get(engine),
        model_engine=origin.model_engine if origin else engine,
        model_size_in_billions=origin.model_size_in_billions if origin else None,
        quantization=origin.quantization if origin else None,
        context_length=origin.context_length if origin else config.engine.get("n_ctx"),
        replica=config.replicas,
        ready_replicas=len(router.replicas),
        state=router.state,
        parent=_parent(cluster, model_id),
    )


@router.get("/lora-adapters")
async def lora_adapters(request: Request, model: str | None = None) -> list[LoraAdapterEntry]:
    """llama-server's list of LoRA adapters (docs/lora.md): those of `model` (a name, alias or
    adapter: its base), or of every model the key reaches; `id` is what a request's `lora` takes."""
    cluster = _cluster(request)
    key = request_context(request).key
    if model is not None:
        configs = [cluster.get(model).config]
        check_model_access(key, configs[0].ids)
    else:
        configs = [r.config for r in cluster.routers() if key is None or key.allows(r.config.ids)]
    return [
        LoraAdapterEntry(id=i, name=a.name, path=_where(a.source), scale=a.scale, model=c.name)
        for c in configs
        for i, a in enumerate(c.adapters)
    ]


def _where(source: ModelSource) -> str:
    if source.path is not None:
        return source.path
    if source.hub is not None:
        return f"{source.hub}:{source.repo}" + (f"/{source.file}" if source.file else "")
    return f"{source.package}:{source.file}"


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
