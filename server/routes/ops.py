"""`GET /ready` and `GET /metrics`: what load balancers and Prometheus poll.

`/health` (in models.py) says the process is up; `/ready` says it should get traffic: not
draining, and every configured model has at least one replica whose actor answers.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.protocol.errors import ServiceUnavailableError
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.transport.lifecycle import Lifecycle

router = APIRouter()


@router.get("/ready")
async def ready(request: Request) -> dict[str, object]:
    lifecycle: Lifecycle = request.app.state.lifecycle
    if lifecycle.draining:
        raise ServiceUnavailableError("The gateway is shutting down.", code="draining")
    cluster: ControllerClient = request.app.state.cluster
    if not cluster.reachable:  # its table may list replicas that died with the controller's node
        raise ServiceUnavailableError("The Raygate controller is unreachable.", code="controller_unreachable")
    routers = cluster.routers()  # ready replicas only: the controller health-checks them
    # An autoscaled model at zero replicas takes traffic: a request starts one.
    missing = [r.config.name for r in routers if not r.servable()]
    if missing:
        raise ServiceUnavailableError(
            f"No ready replica for model(s): {', '.join(missing)}.", code="not_ready"
        )
    return {"status": "ready", "replicas": {r.config.name: len(r.replicas) for r in routers}}


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    gateway_metrics: GatewayMetrics = request.app.state.metrics
    cluster: ControllerClient = request.app.state.cluster
    gateway_metrics.observe_replicas(cluster.routers())
    await gateway_metrics.observe_engines(cluster.routers())
    lifecycle: Lifecycle = request.app.state.lifecycle
    gateway_metrics.draining.set({}, int(lifecycle.draining))
    content, headers = gateway_metrics.render(request.headers.getlist("accept"))
    return Response(content=content, headers=headers)
