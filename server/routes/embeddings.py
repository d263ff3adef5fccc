"""`POST /v1/embeddings`: the route; the work is `server/serving/embeddings.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.embeddings import EmbeddingRequest, EmbeddingResponse
from raygate.server.serving.embeddings import EmbeddingServing
from raygate.server.transport.openapi import answers

router = APIRouter()


@router.post("/v1/embeddings", response_model=None, responses=answers(EmbeddingResponse))
async def create_embedding(body: EmbeddingRequest, request: Request) -> Response:
    return await EmbeddingServing(body, request).respond()
