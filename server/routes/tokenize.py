"""`POST /tokenize` and `POST /detokenize` (vLLM's extension endpoints), for every model: the
routes; the work is `server/serving/tokenize.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.tokenize import DetokenizeBody, DetokenizeResponse, TokenizeBody, TokenizeResponse
from raygate.server.serving.tokenize import DetokenizeServing, TokenizeServing
from raygate.server.transport.openapi import answers

router = APIRouter()


@router.post("/tokenize", response_model=None, responses=answers(TokenizeResponse))
async def tokenize(body: TokenizeBody, request: Request) -> Response:
    return await TokenizeServing(body, request).respond()


@router.post("/detokenize", response_model=None, responses=answers(DetokenizeResponse))
async def detokenize(body: DetokenizeBody, request: Request) -> Response:
    return await DetokenizeServing(body, request).respond()
