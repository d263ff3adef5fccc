"""Fuzzing (fault test 6): schemathesis generates requests from the gateway's own OpenAPI document,
valid and invalid, and sends them to the running operations gateway. Nothing may answer 5xx, hang
or crash the process; every answer's status is one the document lists for its route, and its body
is valid against the schema the document gives for that status (the API's own error shape for a
refusal: server/transport/openapi.py).

Statefully too: the document's OpenAPI links (a created response, file, batch or key -> the routes
that take its id; server/transport/openapi.py), followed as sequences of calls (schemathesis's own
inferred links are off: they made the scenarios depend on what earlier ones left on the server,
which Hypothesis refuses as FlakyStrategyDefinition): the same rules, plus schemathesis's own stateful checks (a created object is there until
deleted, a deleted one is gone).

Bounded: RAYGATE_FUZZ_EXAMPLES cases per operation and mode (default 25, about a minute), as many
stateful scenarios; `make fuzz` runs 200.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config._phases import InferenceConfig
from schemathesis.specs.openapi.checks import (
    ensure_resource_availability,
    response_schema_conformance,
    status_code_conformance,
    use_after_free,
)

from tests.support.gateway import GatewayProcess
from tests.support.ops import ADMIN_KEY

EXAMPLES = int(os.environ.get("RAYGATE_FUZZ_EXAMPLES", "25"))
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHECKS = [status_code_conformance, response_schema_conformance]
# The resources the stateful run creates and follows (the linked routes); the rest of the document
# (deployments, adapters, Ollama's pull and delete) would deploy or remove the models other tests use.
# One line a batch made from an upload runs (on the synthetic model: fast).
BATCH_FILE = (
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": '
    b'{"model": "synth", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}\n'
)
# Two state machines: schemathesis starts scenarios only at the roots it judges reliable when the
# schema has any, and POST /v1/responses is not one (its `previous_response_id` looks like a
# reference nothing produces), so beside files, batches and keys no Responses step was ever taken.
# Alone, it is the only root.
STATEFUL_GROUPS = (r"^/v1/responses(/|$)", r"^/v1/(files|batches)(/|$)|^/admin/keys(/|$)")


def _check_error_body(case: schemathesis.Case, response: schemathesis.Response) -> None:
    """A refusal is the API's own error body, short."""
    if response.status_code >= 400 and case.path.startswith("/v1/"):
        error = response.json()["error"]
        assert isinstance(error["message"], str) and len(response.content) < 4000
    if response.status_code >= 400 and case.path.startswith("/api/"):  # Ollama's body
        assert isinstance(response.json()["error"], str) and len(response.content) < 4000


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
        case.validate_response(response, checks=CHECKS)
        _check_error_body(case, response)

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


@pytest.mark.slow
def test_fuzz_the_linked_routes_statefully(ops_gateway: GatewayProcess) -> None:
    seen: defaultdict[str, Counter[int]] = defaultdict(Counter)  # "METHOD path" -> statuses
    stored: set[str] = set()  # the responses this run created: what `previous_response_id` may name
    for paths in STATEFUL_GROUPS:
        schema = schemathesis.openapi.from_url(f"{ops_gateway.url}/openapi.json").include(path_regex=paths)
        # The published links only. Links schemathesis infers (dependency analysis: a list's items, a
        # revoked key's body) make which rules a scenario may take depend on what earlier scenarios left
        # on the server; Hypothesis then sees one choice sequence lead to different choices and stops on
        # FlakyStrategyDefinition before judging the gateway.
        schema.config.phases.stateful.inference = InferenceConfig(algorithms=[])
        if "/v1/responses" in schema.raw_schema["paths"]:
            links = schema.raw_schema["paths"]["/v1/responses"]["post"]["responses"]["200"]["links"]
            assert {"GetResponse", "ContinueResponse", "DeleteResponse"} <= set(links)
        base = schema.as_state_machine()

        with requests.Session() as session:

            class Linked(base):  # type: ignore[misc, valid-type]
                def before_call(self, case: schemathesis.Case) -> None:
                    if isinstance(case.body, dict):
                        if isinstance(case.body.get("model"), str):
                            case.body["model"] = "synth"  # otherwise nearly every body is a 404
                        if case.path == "/v1/responses":
                            case.body["store"] = True  # an unstored response is rightly a 404 later
                            # A generated `previous_response_id` names nothing (always a 404): only the
                            # ContinueResponse link's, the id of a response this run stored, is kept.
                            if case.body.get("previous_response_id") not in stored:
                                case.body.pop("previous_response_id", None)
                        if case.path == "/v1/files" and case.method == "POST":
                            # A real batch file (else every upload is a 400 and no link is followed).
                            case.body.update(file=BATCH_FILE, purpose="batch")

                def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, object]:
                    return {"base_url": ops_gateway.url, "session": session, "headers": AUTH, "timeout": 60}

                def validate_response(
                    self, response: schemathesis.Response, case: schemathesis.Case, **kwargs: object
                ) -> None:
                    label = f"{case.method} {case.path}"
                    if label == "POST /v1/responses" and isinstance(case.body, dict):
                        if case.body.get("previous_response_id") in stored:
                            label += " (continued)"  # the ContinueResponse link followed
                        if response.status_code == 200 and not case.body.get("stream"):  # a stream is SSE
                            stored.add(response.json()["id"])
                    seen[label][response.status_code] += 1
                    # A revoked key stays readable, `"state": "revoked"` (the audit trail keeps it;
                    # docs/usage-and-budgets.md): not a use after free.
                    freed = [] if case.path.startswith("/admin/keys") else [use_after_free]
                    case.validate_response(
                        response,
                        checks=[not_a_server_error, *CHECKS, *freed, ensure_resource_availability],
                        recorder=self.recorder,
                    )
                    _check_error_body(case, response)

            Linked.run(
                settings=settings(
                    max_examples=EXAMPLES,
                    stateful_step_count=6,
                    deadline=None,
                    database=None,
                    # No replay nor shrinking: which rules may run depends on the server's answers (the
                    # ids in the bundles), so a replayed draw differs and Hypothesis calls it flaky.
                    phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
            )
    print(f"stateful fuzz: { {label: dict(c) for label, c in sorted(seen.items())} }")
    # The links were followed: something was created and then used by its id.
    created = [label for label, statuses in seen.items() if label.startswith("POST") and 200 in statuses]
    followed = [label for label, statuses in seen.items() if "{" in label and 200 in statuses]
    assert created and followed, seen
    # Responses among them: one stored, then one of its links followed (a read, its input items,
    # a continuation by `previous_response_id`, or its deletion).
    continued = 200 in seen["POST /v1/responses (continued)"]
    responses = [label for label in followed if "/v1/responses/{response_id}" in label] or continued
    assert "POST /v1/responses" in created and responses, seen
    assert ops_gateway.proc.poll() is None, "the gateway died"
