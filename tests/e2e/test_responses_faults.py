"""Responses streams when the engine fails, on the operations gateway's fault-injection models
(tests/configs/ops.yaml, `backend: synthetic`): a failure after the first token ends the stream
with `error` and `response.failed` (spec-valid, numbered, nothing stored); a failure before it is
an HTTP error with OpenAI's body, not a stream."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.gateway import GatewayProcess
from tests.support.openapi import validate
from tests.support.ops import ADMIN_KEY

HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def stream(gw: GatewayProcess, model: str) -> tuple[int, list[dict[str, Any]], bytes]:
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/responses",
        json={"model": model, "input": "x", "stream": True, "max_output_tokens": 16},
        headers=HEADERS,
        timeout=60,
    ) as r:
        if r.status_code != 200:
            return r.status_code, [], r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return 200, events, b""


def test_failure_mid_stream_ends_with_error_and_failed(ops_gateway: GatewayProcess) -> None:
    status, events, _ = stream(ops_gateway, "synth-fail")
    assert status == 200
    for i, event in enumerate(events):
        validate(event, "ResponseStreamEvent")
        assert event["sequence_number"] == i
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in types  # it failed after tokens were sent
    assert types[-2:] == ["error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"]
    got = httpx.get(f"{ops_gateway.url}/v1/responses/{failed['id']}", headers=HEADERS, timeout=30)
    assert got.status_code == 404  # only finished responses are stored


def test_failure_before_the_first_token_is_an_http_error(ops_gateway: GatewayProcess) -> None:
    status, events, body = stream(ops_gateway, "synth-slow-start")  # its ttft limit is 0.5 s
    assert status == 504 and not events
    error = json.loads(body)["error"]
    assert error["code"] == "ttft_timeout" and set(error) == {"message", "type", "param", "code"}
