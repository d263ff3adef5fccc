"""The published OpenAPI document says what the gateway answers: a 400 (not FastAPI's 422) and the
other refusals in the route's own error shape, and the 200 body of routes that write their own
response (server/transport/openapi.py). tests/e2e/test_ops_fuzz.py checks live answers against it."""

from __future__ import annotations

from typing import Any

import pytest

from raygate.server.app import build_app
from raygate.server.settings import Settings, resolve_settings
from raygate.server.transport.openapi import ERROR_STATUSES, LINKS


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_app(resolve_settings(Settings())).openapi()


def _ref(operation: dict[str, Any], status: str) -> str:
    return str(operation["responses"][status]["content"]["application/json"]["schema"]["$ref"])


def test_every_operation_lists_the_refusals_in_its_apis_shape(document: dict[str, Any]) -> None:
    shapes = {}
    for path, operations in document["paths"].items():
        for operation in operations.values():
            assert "422" not in operation["responses"], path
            assert {str(s) for s in ERROR_STATUSES} <= set(operation["responses"]), path
            shapes[path] = _ref(operation, "400").rsplit("/", 1)[-1]
    assert shapes["/v1/chat/completions"] == shapes["/admin/deployments"] == "OpenAIErrorResponse"
    assert shapes["/v1/messages"] == shapes["/v1/messages/count_tokens"] == "AnthropicErrorResponse"
    assert shapes["/v1/models/{model_id}"] == "XinferenceErrorResponse"
    assert shapes["/api/chat"] == shapes["/api/tags"] == "OllamaErrorResponse"
    assert "HTTPValidationError" not in document["components"]["schemas"]


@pytest.mark.parametrize(
    ("path", "method", "schema", "streams"),
    [
        ("/v1/chat/completions", "post", "ChatCompletion", True),
        ("/v1/completions", "post", "Completion", True),
        ("/v1/embeddings", "post", "EmbeddingResponse", False),
        ("/v1/messages", "post", "Message", True),
        ("/v1/responses", "post", "ResponseObject", True),
        ("/v1/responses/{response_id}", "delete", "DeletedResponse", False),
        ("/v1/rerank", "post", "RerankResponse", False),
        ("/tokenize", "post", "TokenizeResponse", False),
    ],
)
def test_routes_that_write_their_own_response_document_its_body(
    document: dict[str, Any], path: str, method: str, schema: str, streams: bool
) -> None:
    operation = document["paths"][path][method]
    assert _ref(operation, "200").endswith(f"/{schema}")
    assert ("text/event-stream" in operation["responses"]["200"]["content"]) is streams


def test_created_objects_link_to_the_routes_that_take_their_id(document: dict[str, Any]) -> None:
    """OpenAPI links (what schemathesis's stateful fuzz follows): each names a real operation, and
    every path parameter of the target is filled from the created object's `id`."""
    operation_ids = {
        op["operationId"]: (path, method)
        for path, ops in document["paths"].items()
        for method, op in ops.items()
    }
    linked = {}
    for path, method, status in LINKS:
        answer = document["paths"].get(path, {}).get(method, {}).get("responses", {}).get(status)
        if answer is None:
            continue  # a route this app does not serve
        for name, link in answer["links"].items():
            target_path, target_method = operation_ids[link["operationId"]]
            linked[name] = (target_path, target_method)
            for parameter in document["paths"][target_path][target_method].get("parameters", []):
                if parameter["in"] == "path":
                    assert link["parameters"][parameter["name"]] == "$response.body#/id", name
    assert linked["GetResponse"] == ("/v1/responses/{response_id}", "get")
    assert linked["DeleteFile"] == ("/v1/files/{file_id}", "delete")
    assert linked["CancelBatch"] == ("/v1/batches/{batch_id}/cancel", "post")
    assert linked["CreateBatch"] == ("/v1/batches", "post")
