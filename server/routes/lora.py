"""LoRA adapters loaded and unloaded at run time: vLLM's `POST /v1/load_lora_adapter` and
`POST /v1/unload_lora_adapter` (its bodies, its plain-text answers), and the same on `/admin`
with JSON answers (the deployment's status). Admin key on both (docs/lora.md)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.protocol.admin import DeploymentStatus, LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from raygate.protocol.errors import BadRequestError
from raygate.protocol.lora import AdapterConfig
from raygate.protocol.model_source import ModelSource
from raygate.server.access.admin_auth import require_admin_key
from raygate.server.context import request_context

router = APIRouter(tags=["lora"], dependencies=[Depends(require_admin_key)])


def _cluster(request: Request) -> ControllerClient:
    cluster: ControllerClient = request.app.state.cluster
    return cluster


async def _load(request: Request, body: LoadLoraAdapterRequest) -> DeploymentStatus:
    request_context(request).audit_target = body.lora_name
    try:
        adapter = AdapterConfig(name=body.lora_name, source=_source(body.lora_path), scale=body.scale)
    except ValueError as exc:  # pydantic's ValidationError: a name a model id cannot be
        raise BadRequestError(
            f"Invalid LoRA adapter `{body.lora_name[:40]}`: {exc}", param="lora_name"
        ) from None
    status: DeploymentStatus = await _cluster(request).admin("load_adapter", body.base_model_name, adapter)
    return status


def _source(lora_path: str) -> ModelSource:
    """`hf:ORG/REPO` (or `modelscope:ORG/REPO`) is a Hub repository, as a model's `source: {hf:}`;
    anything else a path on the replicas' nodes."""
    hub, _, repo = lora_path.partition(":")
    if hub in ("hf", "modelscope") and repo:
        return ModelSource.model_validate({hub: repo})
    return ModelSource(path=lora_path)


async def _unload(request: Request, name: str) -> DeploymentStatus:
    request_context(request).audit_target = name
    status: DeploymentStatus = await _cluster(request).admin("unload_adapter", name)
    return status


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request) -> str:
    await _load(request, body)
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request) -> str:
    await _unload(request, body.lora_name)
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."


@router.post("/admin/adapters")
async def admin_load_adapter(body: LoadLoraAdapterRequest, request: Request) -> DeploymentStatus:
    return await _load(request, body)


@router.delete("/admin/adapters/{name}")
async def admin_unload_adapter(name: str, request: Request) -> DeploymentStatus:
    return await _unload(request, name)
