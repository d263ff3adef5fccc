"""Xinference's REST API (protocol/xinference.py): registrations, prompt styles, launch, terminate.

Thin: each route is one controller call. Registering, launching and terminating change the
registry, so they want the admin key exactly as `/admin` does (`require_admin_key`; the middleware
leaves these paths to it, `server/access/admin_auth.is_admin_path`). Errors carry Xinference's `detail`
beside OpenAI's `error` (server/transport/errors.py): Xinference's client shows `detail`.

`GET /v1/models/{uid}` stays in routes/models.py, where OpenAI clients read it too.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.protocol.admin import DeploymentStatus
from raygate.protocol.errors import BadRequestError, ModelNotFoundError
from raygate.protocol.xinference import LaunchRequest, LaunchResult, ModelFamily, RegisterRequest
from raygate.server.access.admin_auth import require_admin_key

router = APIRouter(tags=["xinference"])
admin = [Depends(require_admin_key)]

# A launch answers once the model is ready, as Xinference's does (`wait_ready=false`: at once).
LAUNCH_WAIT_SECONDS = 900.0
LAUNCH_POLL_SECONDS = 0.25
TERMINATE_DRAIN_SECONDS = 30.0


def _cluster(request: Request) -> ControllerClient:
    cluster: ControllerClient = request.app.state.cluster
    return cluster


@router.get("/v1/cluster/auth")
async def cluster_auth(request: Request) -> dict[str, bool]:
    """Xinference's client asks this first; only when it says `auth` does it send its key."""
    return {"auth": bool(request.app.state.settings.admin_key) or request.app.state.keys.enabled}


@router.get("/v1/model_registrations/{model_type}", dependencies=admin)
async def list_registrations(
    model_type: str, request: Request, detailed: bool = Query(False)
) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = await _cluster(request).admin("registrations", model_type, detailed)
    return result


@router.get("/v1/model_registrations/{model_type}/{model_name}", dependencies=admin)
async def get_registration(model_type: str, model_name: str, request: Request) -> ModelFamily:
    family: ModelFamily = await _cluster(request).admin("registration", model_type, model_name)
    return family


@router.post("/v1/model_registrations/{model_type}", dependencies=admin)
async def register(model_type: str, body: RegisterRequest, request: Request) -> None:
    try:
        family = body.family()
    except ValueError as exc:
        raise BadRequestError(str(exc), param="model") from None
    await _cluster(request).admin("register", model_type, family, body.persist)


@router.delete("/v1/model_registrations/{model_type}/{model_name}", dependencies=admin)
async def unregister(model_type: str, model_name: str, request: Request) -> None:
    await _cluster(request).admin("unregister", model_type, model_name)


@router.get("/v1/models/prompts")
async def prompt_styles(request: Request) -> dict[str, dict[str, Any]]:
    styles: dict[str, dict[str, Any]] = await _cluster(request).admin("prompt_styles")
    return styles


@router.post("/v1/models", dependencies=admin)
async def launch(body: LaunchRequest, request: Request, wait_ready: bool = Query(True)) -> LaunchResult:
    """Deploy the registration; with `wait_ready` (the default) answer once it is ready, and undo a
    launch whose replicas fail to load, so a refused launch leaves nothing behind."""
    cluster = _cluster(request)
    status: DeploymentStatus = await cluster.admin("launch", body)
    uid = status.name
    deadline = time.monotonic() + LAUNCH_WAIT_SECONDS
    while wait_ready and status.state in ("downloading", "loading") and time.monotonic() < deadline:
        await asyncio.sleep(LAUNCH_POLL_SECONDS)
        status = await cluster.admin("get", uid)
    if wait_ready and status.state == "failed":
        await cluster.admin("undeploy", uid, 0.0)
        raise BadRequestError(f"Model `{uid}` failed to load: {status.error}", param="model_name")
    return LaunchResult(model_uid=uid)


@router.delete("/v1/models/{model_uid}", dependencies=admin)
async def terminate(model_uid: str, request: Request) -> None:
    cluster = _cluster(request)
    try:
        await cluster.admin("undeploy", model_uid, TERMINATE_DRAIN_SECONDS)
    except ModelNotFoundError:
        raise ModelNotFoundError(
            f"There is no model with uid `{model_uid[:128]}`.", param="model_uid"
        ) from None
