"""Access and limits at the door: API keys (401/403/429), CORS, the body size limit (413) and bounded
validation messages. Fault test 8 of the operations issue."""

from __future__ import annotations

import base64
import json

import httpx
import openai
import pytest

from tests.support.gateway import GatewayProcess
from tests.support.ops import (
    ADMIN_KEY,
    ALL_KEYS,
    ALLOWED_ORIGIN,
    LIMITED_KEY,
    MAX_BODY,
    REAL_MODEL,
    SMOLLM_KEY,
)
from tests.support.replicas import replica_stats

SYNTH_BODY = {"model": "synth", "prompt": "hello", "max_tokens": 2}


def _served() -> int:
    return sum(s.requests_total for s in replica_stats("synth"))


def _assert_openai_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error


HEADER_TRICKS: list[tuple[str, list[tuple[str, str | bytes]]]] = [
    ("no header", []),
    ("wrong key", [("Authorization", "Bearer sk-test-wrong-0123456789")]),
    ("scheme only", [("Authorization", "Bearer")]),
    ("key without scheme", [("Authorization", ADMIN_KEY)]),
    ("basic auth", [("Authorization", "Basic " + base64.b64encode(f"user:{ADMIN_KEY}".encode()).decode())]),
    ("key prefix", [("Authorization", f"Bearer {ADMIN_KEY[:-1]}")]),
    ("key plus suffix", [("Authorization", f"Bearer {ADMIN_KEY}0")]),
    ("two spaces", [("Authorization", f"Bearer  {ADMIN_KEY}")]),
    ("trailing junk", [("Authorization", f"Bearer {ADMIN_KEY} extra")]),
    (
        "two headers, good second",
        [("Authorization", "Bearer nope-nope-nope"), ("Authorization", f"Bearer {ADMIN_KEY}")],
    ),
    (
        "two headers, good first",
        [("Authorization", f"Bearer {ADMIN_KEY}"), ("Authorization", "Bearer nope-nope-nope")],
    ),
    ("x-api-key, wrong key", [("X-Api-Key", "sk-test-wrong-0123456789")]),
    (
        "x-api-key disagreeing with Bearer",
        [("X-Api-Key", ADMIN_KEY), ("Authorization", "Bearer nope-nope-nope")],
    ),
    ("api-key header", [("api-key", ADMIN_KEY)]),
    ("non-ascii", [("Authorization", f"Bearer {ADMIN_KEY}\u00e9".encode("latin-1"))]),
    ("proxy header", [("Proxy-Authorization", f"Bearer {ADMIN_KEY}")]),
]


def test_bad_credentials_get_401_and_are_never_served(ops_gateway: GatewayProcess) -> None:
    before = _served()
    with httpx.Client(base_url=ops_gateway.url, timeout=30) as c:
        for name, headers in HEADER_TRICKS:
            r = c.post("/v1/completions", json=SYNTH_BODY, headers=headers)
            _assert_openai_error(r, 401, "invalid_api_key")
            assert r.headers["www-authenticate"] == "Bearer", name
        # The key as a query parameter is not a credential either.
        r = c.post(f"/v1/completions?api_key={ADMIN_KEY}", json=SYNTH_BODY)
        _assert_openai_error(r, 401, "invalid_api_key")
        # Every /v1 path is guarded, known or not; probes are not.
        for path in ("/v1/models", "/v1/models/synth", "/v1/nope", "/v1"):
            assert c.get(path).status_code == 401, path
        # So are the model endpoints outside /v1 (Jina's and Cohere's v2 rerank paths).
        rerank = {"model": "synth", "query": "q", "documents": ["d"]}
        for path in ("/rerank", "/v2/rerank", "/v1/rerank"):
            _assert_openai_error(c.post(path, json=rerank), 401, "invalid_api_key")
        for path in ("/health", "/ready", "/metrics"):
            assert c.get(path).status_code == 200, path
    assert _served() == before, "a request without a valid key reached an engine"


def test_scheme_is_case_insensitive(ops_gateway: GatewayProcess) -> None:
    r = httpx.post(
        f"{ops_gateway.url}/v1/completions", json=SYNTH_BODY, headers={"Authorization": f"bearer {ADMIN_KEY}"}
    )
    assert r.status_code == 200


def test_model_limited_key_with_the_openai_sdk(ops_gateway: GatewayProcess) -> None:
    """The `smollm-only` key reaches the real llama.cpp model, by alias or name, and nothing else."""
    before = _served()
    with openai.OpenAI(base_url=f"{ops_gateway.url}/v1", api_key=SMOLLM_KEY, max_retries=0, timeout=120) as c:
        r = c.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert r.choices[0].message.content
        assert c.models.retrieve(REAL_MODEL).id == REAL_MODEL
        assert sorted(m.id for m in c.models.list()) == sorted([REAL_MODEL, "smollm2"])
        with pytest.raises(openai.PermissionDeniedError) as denied:
            c.completions.create(model="synth", prompt="x", max_tokens=2)
        assert denied.value.status_code == 403 and denied.value.code == "model_not_allowed"
        with pytest.raises(openai.PermissionDeniedError):
            c.models.retrieve("synth")
    with openai.OpenAI(base_url=f"{ops_gateway.url}/v1", api_key="sk-not-a-key-000000", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
    assert _served() == before


def test_rate_limited_key_gets_429_with_retry_after(ops_gateway: GatewayProcess) -> None:
    """`slow-client` may send 2 requests a minute (a bucket of 2, refilled at 1 per 30 s)."""
    with httpx.Client(base_url=ops_gateway.url, headers={"Authorization": f"Bearer {LIMITED_KEY}"}) as c:
        assert [c.get("/v1/models").status_code for _ in range(2)] == [200, 200]
        r = c.get("/v1/models")
    _assert_openai_error(r, 429, "rate_limit_exceeded")
    assert 1 <= int(r.headers["retry-after"]) <= 30
    # Other keys are not affected.
    assert (
        httpx.get(
            f"{ops_gateway.url}/v1/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ).status_code
        == 200
    )


def test_keys_never_reach_the_log(ops_gateway: GatewayProcess, admin: httpx.Client) -> None:
    admin.post("/v1/completions", json=SYNTH_BODY).raise_for_status()
    httpx.get(f"{ops_gateway.url}/v1/models", headers={"Authorization": f"Bearer {SMOLLM_KEY}"})
    log = ops_gateway.log()
    assert '"key_name": "admin"' in log
    for key in ALL_KEYS:
        assert key not in log and key[:16] not in log


def test_cors(ops_gateway: GatewayProcess) -> None:
    preflight = {
        "Origin": ALLOWED_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    with httpx.Client(base_url=ops_gateway.url) as c:
        ok = c.options("/v1/chat/completions", headers=preflight)
        assert ok.status_code == 200  # answered without a key: browsers never send one on preflight
        assert ok.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        denied = c.options("/v1/chat/completions", headers={**preflight, "Origin": "http://evil.example"})
        assert denied.status_code == 400
        assert "access-control-allow-origin" not in denied.headers
        # Actual responses, errors included, carry the CORS headers so the page can read them.
        listed = c.get(
            "/v1/models", headers={"Origin": ALLOWED_ORIGIN, "Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert listed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "x-request-id" in listed.headers["access-control-expose-headers"].lower()
        refused = c.get("/v1/models", headers={"Origin": ALLOWED_ORIGIN})
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == ALLOWED_ORIGIN


def test_body_size_limit(admin: httpx.Client) -> None:
    before = _served()
    big = json.dumps({**SYNTH_BODY, "prompt": "a" * MAX_BODY}).encode()
    _assert_openai_error(
        admin.post("/v1/completions", content=big, headers={"Content-Type": "application/json"}),
        413,
        "payload_too_large",
    )

    def chunks():  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    _assert_openai_error(
        admin.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}),
        413,
        "payload_too_large",
    )
    assert _served() == before
    under = {**SYNTH_BODY, "prompt": "a" * (MAX_BODY - 200)}
    assert admin.post("/v1/completions", json=under).status_code == 200


def test_validation_message_is_bounded(admin: httpx.Client) -> None:
    """A 4.5 KB body of wrong types must not produce a huge error (it once made 23.6 MB elsewhere)."""
    body = {"model": "synth", "messages": [{"role": 7, "content": {"x": [1] * 5}}] * 100, "n": "x" * 100}
    raw = json.dumps(body)
    assert len(raw) > 4500
    r = admin.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert len(r.content) < 2000
