"""`POST /v1/chat/completions`: the route; the work is `server/serving/chat.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.chat import ChatCompletion, ChatCompletionRequest
from raygate.server.serving.chat import ChatServing
from raygate.server.transport.openapi import answers

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None, responses=answers(ChatCompletion, stream=True))
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await ChatServing(body, request).respond()
