"""Model resolution: from the body's `model` to an admitted `ModelHandle`, or an error response.

Everything here happens before the first byte of the response and before anything reaches an
engine, so each refusal gets its own HTTP status (404, 403, 400, 429).
"""

from __future__ import annotations

from fastapi import Request

from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.backends.cluster.routing.router import ModelRouter
from raygate.protocol.base import RequestModel
from raygate.protocol.config import Task
from raygate.protocol.errors import BadRequestError, RateLimitError, UnsupportedParameterError
from raygate.server.access.auth import check_model_access
from raygate.server.context import request_context
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.serving.admission import Admission, engine_slots
from raygate.server.serving.handle import ModelHandle
from raygate.server.serving.lora_choice import request_lora
from raygate.server.serving.request_usage import record_usage
from raygate.server.transport.unknown_fields import UnknownFieldLog

_TASK_ENDPOINTS = {
    "generate": "chat and text completions",
    "embed": "embeddings",
    "rerank": "rerank and score",
}


def resolve_model(
    request: Request, endpoint: str, body: RequestModel, task: Task | tuple[Task, ...] | None
) -> ModelHandle:
    """The model the body names, checked against the API key, and admitted (or refused with 429).
    `task=None`: any model will do (tokenizers); a tuple: any of these (rerank takes cross-encoders
    and embedding models), the first naming the endpoint in the refusal."""
    cluster: ControllerClient = request.app.state.cluster
    unknown_fields: UnknownFieldLog = request.app.state.unknown_fields
    unknown_fields.note(endpoint, body)
    # Every body that reaches a model names it; the base model does not declare the field.
    router = cluster.get(str(getattr(body, "model")))  # noqa: B009
    ctx = request_context(request)
    check_model_access(ctx.key, router.config.ids)
    tasks = (task,) if isinstance(task, str) else task
    if tasks is not None and router.config.task not in tasks:
        raise BadRequestError(
            f"Model `{router.config.name}` serves {_TASK_ENDPOINTS[router.config.task]}, "
            f"not {_TASK_ENDPOINTS[tasks[0]]}.",
            param="model",
        )
    unsupported: list[str] = getattr(body, "unsupported_fields", list)()
    if unsupported:
        raise UnsupportedParameterError(
            f"`{unsupported[0]}` is not supported by the {router.config.backend} backend yet.",
            param=unsupported[0],
        )
    priority = getattr(body, "priority", None)
    if isinstance(priority, int):
        ctx.priority = priority
    adapter = cluster.adapter(str(getattr(body, "model")))  # noqa: B009
    lora = request_lora(router.config, adapter, getattr(body, "lora", None))
    return open_model(request, router, endpoint, lora)


def open_model(
    request: Request, router: ModelRouter, endpoint: str = "", lora: tuple[tuple[str, float], ...] = ()
) -> ModelHandle:
    """Admit the request to `router`'s model (or refuse it with 429) and wrap the router; its
    usage is recorded under `endpoint` when the request ends. `lora`: the LoRA adapters (name,
    scale) every sequence decodes under (`lora_choice.py`)."""
    state = request.app.state
    ctx = request_context(request)
    ctx.model = router.config.name
    admission: Admission = state.admission
    metrics: GatewayMetrics = state.metrics
    gate = admission.gate(router.config.name, router.config.limits)
    per_replica = engine_slots(router.config)
    gate.slots = None if per_replica is None else per_replica * max(1, len(router.replicas))
    priority = ctx.priority
    if priority is None:
        priority = ctx.key.priority if ctx.key is not None and ctx.key.priority is not None else 0
    try:
        ticket = gate.enter(priority, batch=ctx.batch)
    except RateLimitError:
        metrics.rejected.inc({"model_name": router.config.name, "reason": "queue_full"})
        raise
    ctx.on_close(ticket.release)
    handle = ModelHandle(router, ctx, ticket, metrics, state.settings, lora, getattr(state, "budgets", None))
    ctx.on_close(lambda: record_usage(request, handle, endpoint))
    return handle
