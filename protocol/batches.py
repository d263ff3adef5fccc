"""The Batch API (`/v1/batches`): the create body, the batch object, and one line of a batch's
input and output files (OpenAI's `Batch`, `BatchRequestInput`, `BatchRequestOutput`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, ValidationError

from raygate.protocol.base import NestedOmitsNone, RequestModel, ResponseModel, StrictModel
from raygate.protocol.errors import OpenAIError

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
BATCH_STATUSES: tuple[BatchStatus, ...] = get_args(BatchStatus)
# Statuses a batch never leaves.
FINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})
# OpenAI's limit on one batch's lines.
MAX_BATCH_LINES = 50_000
MAX_METADATA_PAIRS = 16


class BatchNotFoundError(OpenAIError):
    """404 for a batch id that is unknown or another key's."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "batch_not_found"

    @classmethod
    def for_id(cls, batch_id: str) -> BatchNotFoundError:
        return cls(f"No batch found with id '{batch_id}'.", param="batch_id")


class CreateBatchRequest(RequestModel):
    """Body of `POST /v1/batches`."""

    input_file_id: str = Field(min_length=1)
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA_PAIRS)


class BatchInputLine(StrictModel):
    """One line of a batch input file. Strict: a misspelt `custom_id` is a bad line, not a lost one."""

    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"]
    url: BatchEndpoint
    body: dict[str, Any]


class BatchError(NestedOmitsNone):
    """One reason a batch failed validation, or a line's own error in the error file."""

    omit_when_none: ClassVar[frozenset[str]] = frozenset()

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(ResponseModel):
    """Why a batch failed validation (`errors` of a `failed` batch)."""

    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(ResponseModel):
    """Lines in all, and of them those answered (completed) and those in the error file (failed)."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(ResponseModel):
    """The batch object (OpenAI's `Batch`): timestamps are Unix seconds, unset ones null."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = "24h"
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts = Field(default_factory=BatchRequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(ResponseModel):
    """`GET /v1/batches`: newest first, paged with `after` and `limit`."""

    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class BatchLineResponse(ResponseModel):
    """What the endpoint answered to one line: its HTTP status, request id and JSON body."""

    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchOutputLine(ResponseModel):
    """One line of a batch's output or error file: the input line's `custom_id` and either the
    endpoint's answer (`response`; a 4xx/5xx answer goes to the error file) or, for a line that
    never got one (expired, cancelled, failed twice), `error`."""

    id: str
    custom_id: str
    response: BatchLineResponse | None = None
    error: BatchError | None = None


def parse_batch_lines(
    content: bytes, endpoint: str | None = None
) -> tuple[list[BatchInputLine], list[BatchError]]:
    """A batch input file's lines, and what is wrong with them (1-based line numbers): each line
    one JSON object of OpenAI's request-input shape, `custom_id`s unique, at most
    `MAX_BATCH_LINES`, and (when `endpoint` is given) every `url` that endpoint."""
    lines: list[BatchInputLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return [], [BatchError(code="invalid_json_line", message="The file is not UTF-8 text.")]
    number = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = BatchInputLine.model_validate_json(raw)
        except ValidationError as exc:
            errors.append(BatchError(code="invalid_request", message=_line_problem(exc), line=number))
            continue
        if line.custom_id in seen:
            errors.append(
                BatchError(
                    code="duplicate_custom_id",
                    message=f"The custom_id `{line.custom_id}` appears more than once; each must be unique.",
                    param="custom_id",
                    line=number,
                )
            )
        elif endpoint is not None and line.url != endpoint:
            errors.append(
                BatchError(
                    code="mismatched_url",
                    message=f"The url `{line.url}` does not match the batch's endpoint `{endpoint}`.",
                    param="url",
                    line=number,
                )
            )
        seen.add(line.custom_id)
        lines.append(line)
        if len(lines) > MAX_BATCH_LINES:
            errors.append(
                BatchError(
                    code="too_many_requests",
                    message=f"A batch holds at most {MAX_BATCH_LINES} requests.",
                    line=number,
                )
            )
            break
    return lines, errors


def _line_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return "The line is not valid JSON."
    if first["type"] in ("model_type", "model_attributes_type"):
        return "The line must be a JSON object with custom_id, method, url and body."
    field = ".".join(str(p) for p in first["loc"]) or "line"
    if first["type"] == "missing":
        return f"`{field}`: field required."
    if first["type"] == "extra_forbidden":
        return f"`{field}`: unknown field (a line holds custom_id, method, url and body)."
    return f"`{field}`: {first['msg']}."[:500]
