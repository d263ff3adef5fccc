"""`/admin/deployments`: list, deploy, scale, update and undeploy models while the gateway runs.

Deploy, scale and update answer 202 as soon as the change is accepted; loading a model can take
minutes, so clients poll `GET /admin/deployments/{name}` (the CLI shows it as progress). Undeploy
answers when the replicas have drained (bounded by `timeout`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.protocol.admin import DeploymentList, DeploymentStatus, ScaleRequest, UndeployResult
from raygate.protocol.admin import MetricsHistory as MetricsHistoryBody
from raygate.protocol.config import ModelConfig
from raygate.server.access.admin_auth import require_admin_key
from raygate.server.context import request_context
from raygate.server.observability.metrics_history import MetricsHistory

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin_key)])


def _cluster(request: Request) -> ControllerClient:
    cluster: ControllerClient = request.app.state.cluster
    return cluster


@router.get("/deployments")
async def list_deployments(request: Request) -> DeploymentList:
    return DeploymentList(data=await _cluster(request).admin("list_deployments"))


@router.get("/deployments/{name}")
async def get_deployment(name: str, request: Request) -> DeploymentStatus:
    status: DeploymentStatus = await _cluster(request).admin("get", name)
    return status


@router.post("/deployments", status_code=202)
async def deploy(spec: ModelConfig, request: Request) -> DeploymentStatus:
    request_context(request).audit_target = spec.name
    status: DeploymentStatus = await _cluster(request).admin("deploy", spec)
    return status


@router.patch("/deployments/{name}", status_code=202)
async def scale(name: str, body: ScaleRequest, request: Request) -> DeploymentStatus:
    status: DeploymentStatus = await _cluster(request).admin("scale", name, body.replicas, body.drain_timeout)
    return status


@router.put("/deployments/{name}", status_code=202)
async def update(name: str, spec: ModelConfig, request: Request) -> DeploymentStatus:
    status: DeploymentStatus = await _cluster(request).admin("update", name, spec)
    return status


@router.delete("/deployments/{name}")
async def undeploy(
    name: str,
    request: Request,
    timeout: float = Query(30.0, ge=0, le=3600, description="Seconds to let in-flight requests finish."),
) -> UndeployResult:
    result: UndeployResult = await _cluster(request).admin("undeploy", name, timeout)
    return result


@router.get("/metrics")
async def metrics_history(request: Request) -> MetricsHistoryBody:
    """The last minutes of the gateway's metrics per model, for the web console's charts
    (server/observability/metrics_history.py); Prometheus' `/metrics` has the same facts as counters."""
    history: MetricsHistory = request.app.state.metrics_history
    return history.series()
