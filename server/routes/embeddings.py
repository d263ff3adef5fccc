"""`POST /v1/embeddings`: the route; the work is `server/serving/embeddings.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.embeddings import EmbeddingRequest
from raygate.server.serving.embeddings import EmbeddingServing

router = APIRouter()


@router.post("/v1/embeddings", response_model=None)
async def create_embedding(body: EmbeddingRequest, request: Request) -> Response:
    return await EmbeddingServing(body, request).respond()
