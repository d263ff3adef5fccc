"""The Files API on the request path: upload (checked line by line when it is a batch's input),
list, read, download and delete, each key seeing only its own files.

Files belong to the API key that uploaded them (or, for a batch's results, that created the
batch), keyed by the key's digest as stored responses are (`stored_responses.owner_of`): another
key's file id answers 404 like an unknown one. The bytes live in the stores actor
(`backends/cluster/stores/batches.py`), under `--state-dir`.
"""

from __future__ import annotations

from typing import Literal

from fastapi import Request, UploadFile

from raygate.backends.cluster.stores.batches import BatchStoreClient
from raygate.protocol.batches import parse_batch_lines
from raygate.protocol.errors import BadRequestError, PayloadTooLargeError
from raygate.protocol.files import UPLOAD_PURPOSES, FileDeleted, FileList, NoSuchFileError, OpenAIFile
from raygate.protocol.text import printable
from raygate.server.serving.stored_responses import owner_of
from raygate.server.settings import Settings

MAX_LIST = 10_000
MAX_FILENAME = 256
# How many of a bad file's lines the 400 names.
MAX_REPORTED_LINES = 3


def batch_store(request: Request) -> BatchStoreClient:
    store: BatchStoreClient = request.app.state.batches
    return store


async def upload(request: Request, file: UploadFile, purpose: str) -> OpenAIFile:
    """Store an upload: a `batch` file must be JSONL of OpenAI's request-input lines (400 naming
    the first bad lines), within `--files-max-bytes` (413) and the key's quota (400)."""
    settings: Settings = request.app.state.settings
    if purpose not in UPLOAD_PURPOSES:
        raise BadRequestError(
            f"Files with purpose `{purpose}` are not supported here; "
            f"use one of: {', '.join(UPLOAD_PURPOSES)}.",
            param="purpose",
        )
    content = await file.read(settings.files_max_bytes + 1)
    if len(content) > settings.files_max_bytes:
        raise PayloadTooLargeError(
            f"The file is larger than this server's limit of {settings.files_max_bytes} bytes.",
        )
    if not content.strip():
        raise BadRequestError("The file is empty.", param="file")
    _, errors = parse_batch_lines(content)
    if errors:
        named = "; ".join(
            f"line {e.line}: {e.message}" if e.line is not None else e.message
            for e in errors[:MAX_REPORTED_LINES]
        )
        more = f" (and {len(errors) - MAX_REPORTED_LINES} more)" if len(errors) > MAX_REPORTED_LINES else ""
        raise BadRequestError(f"Invalid batch file: {named}{more}", param="file", code="invalid_batch_file")
    return await batch_store(request).put_file(
        owner_of(request),
        printable(file.filename or "upload.jsonl")[:MAX_FILENAME],
        purpose,
        content,
        settings.files_quota_bytes,
    )


async def retrieve(request: Request, file_id: str) -> OpenAIFile:
    found = await batch_store(request).get_file(file_id, owner_of(request))
    if found is None:
        raise NoSuchFileError.for_id(file_id)
    return found


async def content(request: Request, file_id: str) -> bytes:
    found = await batch_store(request).file_content(file_id, owner_of(request))
    if found is None:
        raise NoSuchFileError.for_id(file_id)
    return found


async def listing(
    request: Request, purpose: str | None, limit: int, order: Literal["asc", "desc"], after: str | None
) -> FileList:
    if not 1 <= limit <= MAX_LIST:
        raise BadRequestError(f"`limit` must be between 1 and {MAX_LIST}.", param="limit")
    page, more = await batch_store(request).list_files(owner_of(request), purpose, after, limit, order)
    return FileList(
        data=page, has_more=more, first_id=page[0].id if page else None, last_id=page[-1].id if page else None
    )


async def delete(request: Request, file_id: str) -> FileDeleted:
    if not await batch_store(request).delete_file(file_id, owner_of(request)):
        raise NoSuchFileError.for_id(file_id)
    return FileDeleted(id=file_id)
