"""The OpenAPI document the gateway publishes at `/openapi.json`, saying what it really answers.

FastAPI documents a 422 with its own validation body on every route that takes input; this gateway
answers bad input with a 400 in the API's own error shape (`errors.py`), and refuses with 401, 403,
404, 409, 413, 429, 503 and 504 as well. A client generated from the document, or a fuzzer checking
answers against it (tests/e2e/test_ops_fuzz.py), must see those statuses and bodies, chosen by path
with the same rule `error_body` uses.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from raygate.protocol.errors import ErrorResponse
from raygate.protocol.messages_response import ErrorEvent
from raygate.protocol.ollama_response import OllamaErrorResponse
from raygate.protocol.xinference import XinferenceErrorResponse
from raygate.server.transport.errors import speaks_anthropic, speaks_ollama, speaks_xinference

# Every refusal a route may answer (protocol/errors.py's tree), and why, as the document says it.
ERROR_STATUSES: dict[int, str] = {
    400: "Bad request: a field's value, a combination of fields, or a body that is not JSON",
    401: "No API key, or one the gateway does not know",
    403: "The key may not use this model or route",
    404: "No such model or object",
    409: "Clashes with an operation already running on the same target",
    413: "The body is over the gateway's size limit",
    429: "Rate limit or a full queue (Retry-After says when to try again)",
    500: "The engine failed while serving a valid request",
    503: "Draining, loading (Retry-After) or no ready replica",
    504: "No first token, or no end, within the configured time",
}

# The error body by API, under these names in `components.schemas`.
ERROR_MODELS: dict[str, type[BaseModel]] = {
    "OpenAIErrorResponse": ErrorResponse,
    "AnthropicErrorResponse": ErrorEvent,
    "XinferenceErrorResponse": XinferenceErrorResponse,
    "OllamaErrorResponse": OllamaErrorResponse,
}


def error_schema_name(path: str) -> str:
    """The error body's schema for the route at `path` (errors.py's `error_body` rule)."""
    if speaks_ollama(path):
        return "OllamaErrorResponse"
    if speaks_anthropic(path):
        return "AnthropicErrorResponse"
    if speaks_xinference(path):
        return "XinferenceErrorResponse"
    return "OpenAIErrorResponse"


def install_openapi(app: FastAPI) -> None:
    """Replace FastAPI's document builder with one that documents the gateway's error answers."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            document_errors(schema)
            document_links(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document_errors(schema: dict[str, Any]) -> None:
    """Each operation's 422 replaced by the statuses in ERROR_STATUSES, in its API's error shape."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, model in ERROR_MODELS.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[name] = body
    for path, operations in schema.get("paths", {}).items():
        ref = {"$ref": f"#/components/schemas/{error_schema_name(path)}"}
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, description in ERROR_STATUSES.items():
                responses.setdefault(
                    str(status),
                    {"description": description, "content": {"application/json": {"schema": ref}}},
                )
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


# OpenAPI links: an object a route creates, and the routes that take its `id` next (what a client
# generated from the document, or schemathesis's stateful tests, follow). Source (path, method,
# status) -> the link's name -> (target path, method, what of the answer goes where).
LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, dict[str, Any]]]] = {
    ("/v1/responses", "post", "200"): {
        "GetResponse": (
            "/v1/responses/{response_id}",
            "get",
            {"parameters": {"response_id": "$response.body#/id"}},
        ),
        "ListInputItems": (
            "/v1/responses/{response_id}/input_items",
            "get",
            {"parameters": {"response_id": "$response.body#/id"}},
        ),
        "ContinueResponse": (
            "/v1/responses",
            "post",
            {"requestBody": {"previous_response_id": "$response.body#/id"}},
        ),
        "DeleteResponse": (
            "/v1/responses/{response_id}",
            "delete",
            {"parameters": {"response_id": "$response.body#/id"}},
        ),
    },
    ("/v1/files", "post", "200"): {
        "GetFile": ("/v1/files/{file_id}", "get", {"parameters": {"file_id": "$response.body#/id"}}),
        "GetFileContent": (
            "/v1/files/{file_id}/content",
            "get",
            {"parameters": {"file_id": "$response.body#/id"}},
        ),
        "CreateBatch": ("/v1/batches", "post", {"requestBody": {"input_file_id": "$response.body#/id"}}),
        "DeleteFile": ("/v1/files/{file_id}", "delete", {"parameters": {"file_id": "$response.body#/id"}}),
    },
    ("/v1/batches", "post", "200"): {
        "GetBatch": ("/v1/batches/{batch_id}", "get", {"parameters": {"batch_id": "$response.body#/id"}}),
        "CancelBatch": (
            "/v1/batches/{batch_id}/cancel",
            "post",
            {"parameters": {"batch_id": "$response.body#/id"}},
        ),
    },
    ("/admin/keys", "post", "201"): {
        "GetKey": ("/admin/keys/{key_id}", "get", {"parameters": {"key_id": "$response.body#/id"}}),
        "RotateKey": (
            "/admin/keys/{key_id}/rotate",
            "post",
            {"parameters": {"key_id": "$response.body#/id"}},
        ),
        "RevokeKey": ("/admin/keys/{key_id}", "delete", {"parameters": {"key_id": "$response.body#/id"}}),
    },
}


def document_links(schema: dict[str, Any]) -> None:
    """LINKS as OpenAPI `links` on the creating routes' answers, by the targets' operationIds;
    a route this gateway does not serve (e.g. `/admin/keys` without a ledger) links nothing."""
    paths = schema.get("paths", {})
    for (path, method, status), links in LINKS.items():
        answer = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if answer is None:
            continue
        for name, (target, target_method, how) in links.items():
            operation = paths.get(target, {}).get(target_method)
            if operation is not None:
                answer.setdefault("links", {})[name] = {"operationId": operation["operationId"], **how}


def answers(model: type[BaseModel], *, stream: bool = False) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=` for the 200 it writes itself (as a `Response`, so FastAPI cannot see
    the model): the JSON body, and with `stream` the server-sent events `"stream": true` asks for."""
    content: dict[str, Any] = {"application/json": {}}
    if stream:  # each event's data is a JSON object of its own (its API's chunk or event types)
        content["text/event-stream"] = {}
    return {200: {"model": model, "content": content}}
