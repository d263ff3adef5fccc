"""Ollama's `POST /api/pull` as a Hub deployment: `hf.co/ORG/REPO:QUANT` (the name Ollama pulls
Hugging Face GGUFs by) deploys `source: {hf: ORG/REPO, file: "*QUANT*.gguf"}`, and the pull's
progress lines are the deployment's own: its download's bytes, then its load, then `success`.

Ollama's library names (`llama3.2`) live in Ollama's registry, which Raygate does not speak: those
are a 400 naming the form that works. The deployment's name is derived from the reference
(`ollama_models.pulled_name`), so `hf.co/ORG/REPO:QUANT` reaches the pulled model on every `/api/` route
(`ollama_models.model_id`) and a second pull finds it deployed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from raygate.protocol.admin import DeploymentStatus
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import ModelNotFoundError, OpenAIError
from raygate.protocol.model_source import ModelSource
from raygate.protocol.ollama import OllamaError, PullRequest
from raygate.protocol.ollama_response import ProgressResponse
from raygate.server.serving.ollama import OLLAMA_NDJSON
from raygate.server.serving.ollama_models import cluster_of, hub_repo, pulled_name
from raygate.server.serving.streaming import ndjson_response
from raygate.server.transport.errors import error_response

POLL_SECONDS = 0.5


def pull_spec(name: str) -> ModelConfig:
    found = hub_repo(name)
    deployment = pulled_name(name)
    if found is None or deployment is None:
        raise OllamaError(
            f"pull model manifest: `{name}` is not a Hugging Face repository; this server pulls "
            "GGUFs from the Hub as hf.co/ORG/REPO:QUANT (e.g. hf.co/ggml-org/gemma-3-1b-it-GGUF:Q4_K_M)",
            param="model",
        )
    repo, glob = found
    return ModelConfig(name=deployment, source=ModelSource(hf=repo, file=glob))


async def pull(body: PullRequest, request: Request) -> Response:
    """Deploy (unless deployed already) and report until the model serves, or why it cannot."""
    spec = pull_spec(body.model_name)
    cluster = cluster_of(request)
    try:
        cluster.get(spec.name)
        deployed = True
    except ModelNotFoundError:
        deployed = False
    if not deployed:  # a bad reference (no such repository, no single GGUF) is a 400 here
        await cluster.admin("deploy", spec)
    lines = _progress(request, spec.name)
    if body.stream is False:
        last = ProgressResponse(status="success").model_dump_json(exclude_none=True)
        try:
            async for line in lines:
                last = line
        except OpenAIError as exc:
            return error_response(exc, path=request.url.path)
        return Response(last, media_type="application/json")
    return await ndjson_response(lines, OLLAMA_NDJSON)


async def _progress(request: Request, name: str) -> AsyncIterator[str]:
    """Ollama's progress lines from the deployment's status: `pulling manifest`, the download's
    bytes (`pulling <file>`, total and completed), `verifying sha256 digest` once the files are on
    the node, `success` once a replica serves; a failed deployment ends with its reason."""
    cluster = cluster_of(request)
    yield _line("pulling manifest")
    downloaded = False
    while True:
        status: DeploymentStatus = await cluster.admin("get", name)
        download = status.download or next((r.download for r in status.replicas if r.download), None)
        if download is not None and not download.done:
            yield _line(
                f"pulling {download.files[0] if download.files else download.repo}",
                digest=f"sha256:{download.revision}",
                total=download.bytes_total,
                completed=download.bytes_done,
            )
        elif not downloaded and (download is not None or status.state in ("ready", "degraded")):
            downloaded = True
            yield _line("verifying sha256 digest")
        if status.state in ("ready", "degraded") and status.ready > 0:
            yield _line("writing manifest")
            yield _line("success")
            return
        if status.state == "failed":
            raise OllamaError(
                f"pull model manifest: {status.error or 'the deployment failed'}", param="model"
            )
        await asyncio.sleep(POLL_SECONDS)


def _line(status: str, **progress: str | int) -> str:
    return ProgressResponse(status=status, **progress).model_dump_json(exclude_none=True)  # type: ignore[arg-type]
