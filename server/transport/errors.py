"""The one table from exceptions to error responses: OpenAI's body, Anthropic's on the
Messages API's routes (`/v1/messages…`), or Ollama's (`{"error": "..."}`) on `/api/…`, chosen
by the request's path in one place
(`error_response`; Xinference's paths add its `detail`), so every refusal (validation, auth in
the middleware, 404, 429, 500) speaks the protocol of the route it answers.

Validation messages are bounded (a few errors, no echoed input): another server once answered a
4.5 KB body with a 23.6 MB error.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from raygate.protocol.errors import BadRequestError, OpenAIError, PayloadTooLargeError
from raygate.protocol.messages_response import ErrorEvent
from raygate.protocol.ollama_response import OllamaErrorResponse
from raygate.protocol.text import printable
from raygate.protocol.xinference import XinferenceErrorResponse

log = logging.getLogger(__name__)

MAX_REPORTED_ERRORS = 3
MAX_MESSAGE_CHARS = 1000

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


# Anthropic's Messages API: errors on these paths take Anthropic's shape.
MESSAGES_PATH = "/v1/messages"


def speaks_anthropic(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


# Xinference's API shares `/v1/models` with OpenAI's: its client shows the body's `detail`, OpenAI's
# reads `error`, so errors there carry both.
XINFERENCE_PATHS = ("/v1/models", "/v1/model_registrations", "/v1/cluster")


def speaks_xinference(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in XINFERENCE_PATHS)


# Ollama's API: `{"error": "<message>"}` is all its clients read (with the status).
OLLAMA_PATH = "/api/"


def speaks_ollama(path: str) -> bool:
    return path.startswith(OLLAMA_PATH)


def error_body(exc: OpenAIError, path: str = "") -> dict[str, Any]:
    """The error's body in the protocol of the route at `path`."""
    if speaks_ollama(path):
        return OllamaErrorResponse(error=printable(exc.message)).model_dump()
    if speaks_anthropic(path):
        return ErrorEvent.of(exc).model_dump()
    body = exc.to_body()
    if speaks_xinference(path):
        return XinferenceErrorResponse(**body, detail=body["error"]["message"]).model_dump()
    return body


def error_response(exc: OpenAIError, headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
    """`path`: the request's path, which picks the body's protocol (OpenAI's by default)."""
    return JSONResponse(
        error_body(exc, path),
        status_code=exc.status_code,
        headers={**exc.headers(), **(headers or {})} or None,
    )


def validation_error(errors: list[Any]) -> BadRequestError:
    """Summarise pydantic errors as OpenAI does: one message, the first offending field as `param`."""
    parts: list[str] = []
    param: str | None = None
    for err in errors[:MAX_REPORTED_ERRORS]:
        # A location may hold a client's dict key: escape what UTF-8 cannot carry.
        loc = [printable(str(p)) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            parts.append("The request body is not valid JSON.")
            continue
        if not loc and err.get("type") in ("model_attributes_type", "dict_type"):
            parts.append("The request body must be a JSON object.")
            continue
        field = ".".join(loc) or "body"
        param = param or (loc[0] if loc else None)
        msg = printable(str(err.get("msg", "invalid value")))
        if err.get("type") == "string_unicode":  # pydantic's own check, on constrained strings
            msg = "invalid Unicode: a lone surrogate (U+D800-U+DFFF); text must be valid UTF-8"
        parts.append(f"{field}: {'Field required' if err.get('type') == 'missing' else msg}")
    if len(errors) > MAX_REPORTED_ERRORS:
        parts.append(f"(and {len(errors) - MAX_REPORTED_ERRORS} more)")
    message = " ".join(parts)[:MAX_MESSAGE_CHARS]
    return BadRequestError(message or "Invalid request.", param=param)


async def _on_openai_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return error_response(exc, path=request.url.path)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error(list(exc.errors())), path=request.url.path)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 413:  # a streamed body that grew past the limit (server/transport/middleware.py)
        return error_response(PayloadTooLargeError(str(exc.detail)), path=path)
    err = OpenAIError(str(exc.detail))
    err.status_code = exc.status_code
    err.error_type = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
    return error_response(err, headers=dict(exc.headers or {}), path=path)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    error = OpenAIError("The server had an error while processing your request.")
    return error_response(error, path=request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
