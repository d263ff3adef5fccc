"""`POST /v1/rerank` (also `/rerank`, `/v2/rerank`: Jina's, Cohere's v1 and v2 paths) and vLLM's
`POST /v1/score`; the work is `server/serving/rerank.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.rerank import RerankRequest, RerankResponse, ScoreRequest, ScoreResponse
from raygate.server.serving.rerank import RerankServing, ScoreServing
from raygate.server.transport.openapi import answers

router = APIRouter()


@router.post("/v1/rerank", response_model=None, responses=answers(RerankResponse))
@router.post("/v2/rerank", response_model=None, responses=answers(RerankResponse))
@router.post("/rerank", response_model=None, responses=answers(RerankResponse))
async def rerank(body: RerankRequest, request: Request) -> Response:
    return await RerankServing(body, request).respond()


@router.post("/v1/score", response_model=None, responses=answers(ScoreResponse))
async def score(body: ScoreRequest, request: Request) -> Response:
    return await ScoreServing(body, request).respond()
