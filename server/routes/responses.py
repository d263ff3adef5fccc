"""`/v1/responses`: create (the work is `server/serving/responses.py`'s), retrieve, delete, and
list a stored response's input items (`server/serving/stored_responses.py`)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.response_object import DeletedResponse, ResponseItemList, ResponseObject
from raygate.protocol.responses import CreateResponseRequest
from raygate.server.serving import stored_responses
from raygate.server.serving.base import json_response
from raygate.server.serving.responses import ResponsesServing
from raygate.server.transport.openapi import answers

router = APIRouter()


@router.post("/v1/responses", response_model=None, responses=answers(ResponseObject, stream=True))
async def create_response(body: CreateResponseRequest, request: Request) -> Response:
    return await ResponsesServing(body, request).respond()


@router.get("/v1/responses/{response_id}", response_model=None, responses=answers(ResponseObject))
async def retrieve_response(response_id: str, request: Request) -> Response:
    return json_response((await stored_responses.retrieve(request, response_id)).response)


@router.delete("/v1/responses/{response_id}", response_model=None, responses=answers(DeletedResponse))
async def delete_response(response_id: str, request: Request) -> Response:
    return json_response(await stored_responses.delete(request, response_id))


@router.get(
    "/v1/responses/{response_id}/input_items", response_model=None, responses=answers(ResponseItemList)
)
async def list_input_items(
    response_id: str,
    request: Request,
    limit: int = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    return json_response(await stored_responses.input_items(request, response_id, limit, order, after))
