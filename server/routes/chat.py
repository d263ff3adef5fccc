"""`POST /v1/chat/completions`: the route; the work is `server/serving/chat.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.chat import ChatCompletionRequest
from raygate.server.serving.chat import ChatServing

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await ChatServing(body, request).respond()
