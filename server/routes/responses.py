"""`/v1/responses`: create (the work is `server/serving/responses.py`'s), retrieve, delete, and
list a stored response's input items (`server/serving/response_store.py`)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response

from protocol.responses import CreateResponseRequest
from server.serving import response_store
from server.serving.base import json_response
from server.serving.responses import ResponsesServing

router = APIRouter()


@router.post("/v1/responses", response_model=None)
async def create_response(body: CreateResponseRequest, request: Request) -> Response:
    return await ResponsesServing(body, request).respond()


@router.get("/v1/responses/{response_id}", response_model=None)
async def retrieve_response(response_id: str, request: Request) -> Response:
    return json_response((await response_store.retrieve(request, response_id)).response)


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete_response(response_id: str, request: Request) -> Response:
    return json_response(await response_store.delete(request, response_id))


@router.get("/v1/responses/{response_id}/input_items", response_model=None)
async def list_input_items(
    response_id: str,
    request: Request,
    limit: int = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    return json_response(await response_store.input_items(request, response_id, limit, order, after))
