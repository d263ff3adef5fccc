"""`POST /v1/embeddings`."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from fastapi.responses import Response

from protocol.embeddings import Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from protocol.errors import BadRequestError
from protocol.generation import EmbedRequest
from server.requests import new_id, resolve_model

router = APIRouter()


def shorten(vector: list[float], dimensions: int | None) -> list[float]:
    """OpenAI's `dimensions`: keep the first d components, then renormalise to unit length."""
    if dimensions is None or dimensions == len(vector):
        return vector
    if dimensions > len(vector):
        raise BadRequestError(
            f"`dimensions` must be at most {len(vector)} for this model.", param="dimensions"
        )
    head = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in head)) or 1.0
    return [v / norm for v in head]


@router.post("/v1/embeddings", response_model=None)
async def create_embedding(body: EmbeddingRequest, request: Request) -> Response:
    model = resolve_model(request, "embeddings", body, "embed")
    result = await model.embed(EmbedRequest(new_id("embd"), body.inputs()))
    response = EmbeddingResponse(
        data=[
            Embedding(index=i, embedding=Embedding.encode(shorten(v, body.dimensions), body.encoding_format))
            for i, v in enumerate(result.embeddings)
        ],
        model=body.model,
        usage=EmbeddingUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens),
    )
    return Response(response.to_json(), media_type="application/json")
