"""`POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic's Messages API): the routes;
the work is `server/serving/messages.py`'s. Errors on these paths take Anthropic's shape
(server/transport/errors.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.messages import CountTokensRequest, MessagesRequest
from raygate.protocol.messages_response import CountTokensResponse, Message
from raygate.server.serving.messages import CountTokensServing, MessagesServing
from raygate.server.transport.openapi import answers

router = APIRouter()


@router.post("/v1/messages", response_model=None, responses=answers(Message, stream=True))
async def create_message(body: MessagesRequest, request: Request) -> Response:
    return await MessagesServing(body, request).respond()


@router.post("/v1/messages/count_tokens", response_model=None, responses=answers(CountTokensResponse))
async def count_message_tokens(body: CountTokensRequest, request: Request) -> Response:
    return await CountTokensServing(body, request).respond()
