"""The one table from exceptions to OpenAI error responses.

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

from protocol.errors import BadRequestError, OpenAIError, PayloadTooLargeError
from protocol.text import printable

log = logging.getLogger(__name__)

MAX_REPORTED_ERRORS = 3
MAX_MESSAGE_CHARS = 1000

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


def error_response(exc: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        exc.to_body(), status_code=exc.status_code, headers={**exc.headers(), **(headers or {})} or None
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


async def _on_openai_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return error_response(exc)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error(list(exc.errors())))


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 413:  # a streamed body that grew past the limit (server/middleware.py)
        return error_response(PayloadTooLargeError(str(exc.detail)))
    err = OpenAIError(str(exc.detail))
    err.status_code = exc.status_code
    err.error_type = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
    return error_response(err, headers=dict(exc.headers or {}))


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return error_response(OpenAIError("The server had an error while processing your request."))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
