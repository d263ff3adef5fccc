"""The typed error tree: every failure a client can see, with its HTTP status and OpenAI body.

    OpenAIError (500, server_error)
    ├── BadRequestError (400, invalid_request_error)
    │   ├── ContextLengthExceededError (code context_length_exceeded)
    │   └── UnsupportedParameterError (code unsupported_parameter)
    ├── ConflictError (409, invalid_request_error, code conflict)
    ├── ModelNotFoundError (404, invalid_request_error, code model_not_found)
    ├── ServiceUnavailableError (503, service_unavailable)
    │   └── ModelLoadingError (code model_loading, with Retry-After)
    ├── EngineError (500, server_error): the engine failed while serving a valid request
    ├── AuthenticationError (401, invalid_request_error, code invalid_api_key)
    ├── PermissionDeniedError (403, permission_error, code model_not_allowed)
    ├── PayloadTooLargeError (413, invalid_request_error, code payload_too_large)
    ├── RateLimitError (429, requests, code rate_limit_exceeded / queue_full): carries Retry-After
    └── GatewayTimeoutError (504, timeout_error, code ttft_timeout / request_timeout)

Exceptions cross the Ray hop by pickling, so each class keeps its constructor arguments in
`__reduce__`; the server turns any of them into a response with `to_body()` in one place.
"""

from __future__ import annotations

import math
from typing import Any

from raygate.protocol.base import ResponseModel
from raygate.protocol.text import printable


class ErrorObject(ResponseModel):
    """OpenAI's error object: what every OpenAI-shaped refusal carries under `error`."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(ResponseModel):
    """OpenAI's error body, `{"error": {...}}`."""

    error: ErrorObject


class OpenAIError(Exception):
    """Base of every error a client can see: the HTTP status plus OpenAI's error body (`type`, `code`,
    `param`). Raised as itself it is a 500; it pickles across Ray with its arguments."""

    status_code: int = 500
    error_type: str = "server_error"
    default_code: str | None = None
    retry_after: float | None = None  # seconds; answered with a `Retry-After` header

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.param, self.code))

    def headers(self) -> dict[str, str]:
        """HTTP headers the response must carry (e.g. `Retry-After`)."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def to_body(self) -> dict[str, Any]:
        # A message may quote client input: a lone surrogate in it would make the body unencodable.
        error = ErrorObject(
            message=printable(self.message),
            type=self.error_type,
            param=None if self.param is None else printable(self.param),
            code=self.code,
        )
        return ErrorResponse(error=error).model_dump()


def _rebuild(cls: type[OpenAIError], message: str, param: str | None, code: str | None) -> OpenAIError:
    return cls(message, param=param, code=code)


class BadRequestError(OpenAIError):
    """400: the request itself is wrong (a field's value, a combination of fields), so sending it again
    unchanged fails again."""

    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceededError(BadRequestError):
    """400: the prompt plus `max_tokens` exceed the model's context, found before anything is generated."""

    default_code = "context_length_exceeded"

    @classmethod
    def for_request(
        cls, *, context_length: int, prompt_tokens: int, max_tokens: int, param: str
    ) -> ContextLengthExceededError:
        """Use OpenAI's own wording: clients and frameworks parse it to trim history."""
        what = "messages" if param == "messages" else "prompt"
        return cls(
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, {max_tokens} in the "
            f"completion). Please reduce the length of the {what} or completion.",
            param=param,
        )


class UnsupportedParameterError(BadRequestError):
    """400 for an OpenAI field this gateway or the model's backend cannot honour: refused by name (`param`),
    never silently dropped."""

    default_code = "unsupported_parameter"


class ModelNotFoundError(OpenAIError):
    """404 for a `model` no deployment answers to (name or alias), worded as OpenAI words it."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"

    @classmethod
    def for_model(cls, model: str) -> ModelNotFoundError:
        return cls(f"The model `{model}` does not exist or you do not have access to it.", param="model")


class ConflictError(OpenAIError):
    """The request is valid but clashes with an operation already running on the same target."""

    status_code = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class ServiceUnavailableError(OpenAIError):
    """503: nothing is wrong with the request, but it cannot be served now (draining, no ready replica,
    controller restarting); a retry may succeed."""

    status_code = 503
    error_type = "service_unavailable"


class ModelLoadingError(ServiceUnavailableError):
    """The model is deployed but no replica has finished loading: retry rather than give up (404)."""

    default_code = "model_loading"
    retry_after = 5.0


class EngineError(OpenAIError):
    """500 when the engine failed while serving a valid request (a crash, a dead engine process): the server's
    fault, not the request's."""

    status_code = 500
    error_type = "server_error"
    default_code = "engine_error"


class AuthenticationError(OpenAIError):
    """No key, or a key the gateway does not know. OpenAI's own body for a bad key."""

    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class PermissionDeniedError(OpenAIError):
    """403: the API key is valid but its `models` list does not include the requested model."""

    status_code = 403
    error_type = "permission_error"
    default_code = "model_not_allowed"


class PayloadTooLargeError(OpenAIError):
    """413: the body is over `max_body_bytes`, judged from `Content-Length` or as a chunked body arrives."""

    status_code = 413
    error_type = "invalid_request_error"
    default_code = "payload_too_large"


class RateLimitError(OpenAIError):
    """Too many requests for a key, or a model's queue is full. `retry_after` is whole seconds."""

    status_code = 429
    error_type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, retry_after: int = 1
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.retry_after = max(1, retry_after)


class QuotaExceededError(RateLimitError):
    """The key has spent its token budget (OpenAI's 429 `insufficient_quota`); `retry_after` is
    the seconds until the budget's day or month starts again."""

    error_type = "insufficient_quota"
    default_code = "insufficient_quota"


class GatewayTimeoutError(OpenAIError):
    """The model did not produce its first token, or finish, within the configured time."""

    status_code = 504
    error_type = "timeout_error"
    default_code = "request_timeout"
