"""`/v1/batches`: create, retrieve, list and cancel (`server/serving/batches.py`); the lines run in
`server/serving/batch_runner.py`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from raygate.protocol.batches import Batch, BatchList, CreateBatchRequest
from raygate.server.serving import batches
from raygate.server.serving.base import json_response

router = APIRouter()


@router.post("/v1/batches", response_model=Batch)
async def create_batch(body: CreateBatchRequest, request: Request) -> Response:
    return json_response(await batches.create(request, body))


@router.get("/v1/batches", response_model=BatchList)
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> Response:
    return json_response(await batches.listing(request, after, limit))


@router.get("/v1/batches/{batch_id}", response_model=Batch)
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    return json_response(await batches.retrieve(request, batch_id))


@router.post("/v1/batches/{batch_id}/cancel", response_model=Batch)
async def cancel_batch(batch_id: str, request: Request) -> Response:
    return json_response(await batches.cancel(request, batch_id))
