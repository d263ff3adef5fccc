"""`POST /v1/completions` (the legacy text API, still used by many tools and benchmarks): the route;
the work is `server/serving/completions.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.completions import Completion, CompletionRequest
from raygate.server.serving.completions import CompletionServing
from raygate.server.transport.openapi import answers

router = APIRouter()


@router.post("/v1/completions", response_model=None, responses=answers(Completion, stream=True))
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await CompletionServing(body, request).respond()
