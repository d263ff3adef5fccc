"""`POST /tokenize` and `POST /detokenize` (vLLM's extension endpoints), for every model."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from protocol.tokenize import DetokenizeBody, DetokenizeResponse, TokenizeBody, TokenizeResponse
from server.requests import resolve_model

router = APIRouter()


@router.post("/tokenize", response_model=None)
async def tokenize(body: TokenizeBody, request: Request) -> Response:
    model = resolve_model(request, "tokenize", body, None)
    result = await model.router.tokenize(body.to_engine())
    response = TokenizeResponse(
        count=len(result.tokens),
        max_model_len=result.max_model_len,
        tokens=result.tokens,
        token_strs=result.token_strs if body.return_token_strs else None,
    )
    return Response(response.to_json(), media_type="application/json")


@router.post("/detokenize", response_model=None)
async def detokenize(body: DetokenizeBody, request: Request) -> Response:
    model = resolve_model(request, "detokenize", body, None)
    text = await model.router.detokenize(body.tokens)
    return Response(DetokenizeResponse(prompt=text).to_json(), media_type="application/json")
