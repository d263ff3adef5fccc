"""Fuzzing (fault test 6): schemathesis generates requests from the gateway's own OpenAPI document,
valid and invalid, and sends them to the running operations gateway. Nothing may answer 5xx, hang
or crash the process; every answer's status is one the document lists for its route, and its body
is valid against the schema the document gives for that status (the API's own error shape for a
refusal: server/transport/openapi.py).

Bounded: RAYGATE_FUZZ_EXAMPLES cases per operation and mode (default 25, about a minute);
`make fuzz` runs 200.
"""

from __future__ import annotations

import os

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.support.gateway import GatewayProcess
from tests.support.ops import ADMIN_KEY

EXAMPLES = int(os.environ.get("RAYGATE_FUZZ_EXAMPLES", "25"))
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _fuzz(
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    url: str,
    session: requests.Session,
    seen: dict[int, int],
) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case) -> None:
        # Otherwise nearly every valid body is a 404; never on a DELETE (Ollama's `/api/delete`
        # would undeploy the model the other tests use).
        named = isinstance(case.body, dict) and isinstance(case.body.get("model"), str)
        if named and case.method != "DELETE" and sum(seen.values()) % 2:
            case.body["model"] = "synth"
        response = case.call(base_url=url, session=session, headers=AUTH, timeout=60)
        status = response.status_code
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, f"{case.method} {case.path}: {status} {response.text[:500]}"
        case.validate_response(response, checks=[status_code_conformance, response_schema_conformance])
        if status >= 400 and case.path.startswith("/v1/"):
            error = response.json()["error"]
            assert isinstance(error["message"], str) and len(response.content) < 4000
        if status >= 400 and case.path.startswith("/api/"):  # Ollama's body
            assert isinstance(response.json()["error"], str) and len(response.content) < 4000

    try:
        check()
    except Unsatisfiable:
        # No invalid request exists for an operation without parameters (GET /health).
        assert mode is GenerationMode.NEGATIVE, operation.path


@pytest.mark.slow
def test_fuzz_the_openapi_document(ops_gateway: GatewayProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{ops_gateway.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
    }
    seen: dict[int, int] = {}
    with requests.Session() as session:  # one session, closed: a session per call leaks sockets
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz(operation, mode, ops_gateway.url, session, seen)
    print(f"fuzz: {sum(seen.values())} requests, statuses {dict(sorted(seen.items()))}")
    assert ops_gateway.proc.poll() is None, "the gateway died"
    assert httpx.get(f"{ops_gateway.url}/health").status_code == 200
