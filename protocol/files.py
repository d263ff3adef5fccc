"""The Files API (`/v1/files`): the file object, its list and its deletion, as OpenAI returns them.

Files exist here for the Batch API: `purpose: batch` uploads are a batch's input, and the gateway
writes `batch_output` files (a batch's results and errors) for the client to download.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from raygate.protocol.base import ResponseModel
from raygate.protocol.errors import OpenAIError

FilePurpose = Literal["batch", "batch_output"]
# What a client may upload (OpenAI takes more purposes; only batch input has a use here).
UPLOAD_PURPOSES = ("batch",)


class NoSuchFileError(OpenAIError):
    """404 for a file id that is unknown, deleted, or another key's (indistinguishable on purpose)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "file_not_found"

    @classmethod
    def for_id(cls, file_id: str) -> NoSuchFileError:
        return cls(f"No such File object: {file_id}", param="file_id")


class OpenAIFile(ResponseModel):
    """One stored file (OpenAI's `OpenAIFile`)."""

    omit_when_none: ClassVar[frozenset[str]] = frozenset({"expires_at", "status_details"})

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileList(ResponseModel):
    """`GET /v1/files`: a page of files, newest first unless `order=asc`."""

    object: Literal["list"] = "list"
    data: list[OpenAIFile]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(ResponseModel):
    """`DELETE /v1/files/{id}`."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
