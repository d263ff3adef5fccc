"""`/v1/files`: upload, list, retrieve, download and delete (`server/serving/files.py`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response

from raygate.protocol.files import FileDeleted, FileList, OpenAIFile
from raygate.server.serving import files
from raygate.server.serving.base import json_response

router = APIRouter()


@router.post("/v1/files", response_model=OpenAIFile)
async def upload_file(
    request: Request, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]
) -> Response:
    return json_response(await files.upload(request, file, purpose))


@router.get("/v1/files", response_model=FileList)
async def list_files(
    request: Request,
    purpose: str | None = None,
    limit: int = files.MAX_LIST,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    return json_response(await files.listing(request, purpose, limit, order, after))


@router.get("/v1/files/{file_id}", response_model=OpenAIFile)
async def retrieve_file(file_id: str, request: Request) -> Response:
    return json_response(await files.retrieve(request, file_id))


@router.get("/v1/files/{file_id}/content", response_class=Response)
async def file_content(file_id: str, request: Request) -> Response:
    return Response(await files.content(request, file_id), media_type="application/jsonl")


@router.delete("/v1/files/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, request: Request) -> Response:
    return json_response(await files.delete(request, file_id))
