"""Ollama's API on the gateway's port: the routes; the work is `server/serving/ollama.py`'s
(generation and embeddings, on the one serving layer) and `server/serving/ollama_models.py`'s
(names, tags, show, ps). Errors on `/api/…` take Ollama's shape (server/transport/errors.py);
keys are checked as on `/v1` (server/transport/middleware.py), `/api/delete` wants the admin key.

`/api/pull` deploys a Hugging Face GGUF (`hf.co/ORG/REPO:QUANT`, server/serving/ollama_pull.py) and
`/api/delete` undeploys, both with the admin key; the management verbs Raygate has no concept for
are a 400 naming the verb.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse, Response
from fastapi.routing import APIRoute

from raygate.protocol.ollama import (
    OLLAMA_API_VERSION,
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ModelRequest,
    OllamaError,
    PullRequest,
)
from raygate.protocol.ollama_response import PsResponse, ShowResponse, TagsResponse, VersionResponse
from raygate.server.access.admin_auth import require_admin_key
from raygate.server.access.auth import check_model_access
from raygate.server.context import request_context
from raygate.server.serving import ollama_models, ollama_pull
from raygate.server.serving.ollama import (
    OllamaEmbeddingsServing,
    OllamaEmbedServing,
    chat_serving,
    generate_serving,
)


class JsonBodyRoute(APIRoute):
    """Ollama reads every body as JSON whatever its `Content-Type` (its documented calls are
    `curl -d '{...}'`, which sends a form type): so do these routes."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def as_json(request: Request) -> Response:
            scope = request.scope
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope["headers"] = [*headers, (b"content-type", b"application/json")]
            return await handler(Request(scope, request.receive))

        return as_json


router = APIRouter(tags=["ollama"], route_class=JsonBodyRoute)

# Seconds an undeploy lets in-flight requests finish (as `raygate undeploy`'s default).
DELETE_DRAIN_SECONDS = 30.0
RUNNING = "Ollama is running"


@router.get("/", response_class=PlainTextResponse)
async def root() -> str:
    """What Ollama's clients probe to find a server."""
    return RUNNING


@router.head("/", response_class=PlainTextResponse)
async def root_head() -> str:
    return RUNNING


@router.get("/api/version")
async def version() -> VersionResponse:
    return VersionResponse(version=OLLAMA_API_VERSION)


def _visible(request: Request) -> list[str]:
    """Model ids as `/v1/models` lists them, those the API key may use."""
    cluster = ollama_models.cluster_of(request)
    key = request_context(request).key
    return [i for i in cluster.model_ids() if key is None or key.allows(cluster.get(i).config.ids)]


@router.get("/api/tags")
async def tags(request: Request) -> TagsResponse:
    cluster = ollama_models.cluster_of(request)
    return TagsResponse(models=[ollama_models.listed(cluster, i) for i in _visible(request)])


@router.get("/api/ps")
async def ps(request: Request) -> PsResponse:
    """The models with a ready replica (a model scaled to zero is not running)."""
    cluster = ollama_models.cluster_of(request)
    now = datetime.now(UTC)
    ids = [i for i in _visible(request) if cluster.get(i).replicas]
    return PsResponse(models=[ollama_models.running(cluster, i, now) for i in ids])


@router.post("/api/show")
async def show(body: ModelRequest, request: Request) -> ShowResponse:
    name = body.model_name
    resolved = ollama_models.model_id(request, name)
    cluster = ollama_models.cluster_of(request)
    check_model_access(request_context(request).key, cluster.get(resolved).config.ids)
    return ollama_models.show(cluster, resolved)


@router.post("/api/chat", response_model=None)
async def chat(body: ChatRequest, request: Request) -> Response:
    return await chat_serving(body, request).respond()


@router.post("/api/generate", response_model=None)
async def generate(body: GenerateRequest, request: Request) -> Response:
    return await generate_serving(body, request).respond()


@router.post("/api/embed", response_model=None)
async def embed(body: EmbedRequest, request: Request) -> Response:
    return await OllamaEmbedServing(body, request).respond()


@router.post("/api/embeddings", response_model=None)
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    return await OllamaEmbeddingsServing(body, request).respond()


@router.delete("/api/delete", dependencies=[Depends(require_admin_key)], response_model=None)
async def delete(body: ModelRequest, request: Request) -> Response:
    """Undeploy the model (its replicas drain first), as `DELETE /admin/deployments/{name}`."""
    resolved = ollama_models.model_id(request, body.model_name)
    cluster = ollama_models.cluster_of(request)
    await cluster.admin("undeploy", cluster.get(resolved).config.name, DELETE_DRAIN_SECONDS)
    return Response(status_code=200)


def _refuse(verb: str, why: str) -> OllamaError:
    return OllamaError(f"`{verb}` is not supported by this server: {why}", param=verb)


@router.post("/api/pull", dependencies=[Depends(require_admin_key)], response_model=None)
async def pull(body: PullRequest, request: Request) -> Response:
    """Deploy `hf.co/ORG/REPO:QUANT` from the Hub; NDJSON progress until a replica serves it."""
    return await ollama_pull.pull(body, request)


@router.post("/api/push", response_model=None)
async def refuse_push() -> Response:
    raise _refuse("push", "Raygate serves models, it does not publish them")


@router.post("/api/create", response_model=None)
async def refuse_create() -> Response:
    raise _refuse("create", "deploy models through /admin/deployments (or `raygate deploy`)")


@router.post("/api/copy", response_model=None)
async def refuse_copy() -> Response:
    raise _refuse("copy", "give a deployment another name with `aliases:` in its spec")
