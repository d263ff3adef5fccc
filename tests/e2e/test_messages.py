"""Anthropic's Messages API through the `anthropic` SDK on the default (llama.cpp) gateway: the
suite every backend passes (tests/support/suites/messages.py: create, stream, tools, count_tokens,
errors in Anthropic's shape; tests/e2e/vllm/test_vllm_messages.py reruns it on vLLM), then what
is checked here only: greedy `top_k`, aliases and unknown fields, a raw stream ending at a stop
sequence, the default gateway's metrics, and the errors that need the operations gateway (keys,
limits, fault injection).

Assertions are about structure the feature guarantees, never about the words a tiny model writes.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam, RawMessageStreamEvent

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.ops import ADMIN_KEY, MAX_BODY, MESSAGES_LIMITED_KEY, SMOLLM_KEY, metric, scrape, wait_for
from tests.support.suites.messages import (  # noqa: F401
    GREEDY,
    HELLO,
    WEATHER_TODAY,
    check_error,
    raw_events,
    stop_letters,
    test_any_forces_a_schema_valid_call,
    test_bad_requests_are_400,
    test_count_tokens_equals_create_usage,
    test_create_shape_and_usage,
    test_image_block_is_a_clear_400,
    test_max_tokens_is_honoured,
    test_missing_max_tokens_is_400,
    test_named_tool_forces_that_tool_once,
    test_none_never_calls,
    test_output_format_constrains_the_text,
    test_sdk_stream_accumulates,
    test_stop_sequence_is_reported,
    test_stream_events_in_order,
    test_streamed_input_json_parses_to_valid_input,
    test_system_blocks_and_block_content,
    test_tool_result_round_trip,
    test_unknown_model_and_route_are_404,
)


def test_top_k_one_is_greedy(anthropic_client: anthropic.Anthropic) -> None:
    """`top_k: 1` keeps only the likeliest token: whatever the temperature, the greedy text."""
    ask: list[MessageParam] = [{"role": "user", "content": "Name three colours."}]
    greedy = anthropic_client.messages.create(
        model=CHAT_MODEL, max_tokens=12, messages=ask, extra_body=GREEDY
    )
    top_1 = anthropic_client.messages.create(
        model=CHAT_MODEL, max_tokens=12, messages=ask, extra_body={"temperature": 1.0, "top_k": 1}
    )
    assert top_1.content == greedy.content


def test_alias_and_unknown_fields(gateway: GatewayProcess) -> None:
    """An alias reaches the model (and is echoed back); unknown fields, `cache_control` and the
    SDK's version headers are accepted."""
    r = httpx.post(
        f"{gateway.url}/v1/messages",
        json={
            "model": "smollm2",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}],
                }
            ],
            "metadata": {"user_id": "user-1"},
            "top_k": 0,
            "service_tier": "auto",
            "some_future_field": {"x": 1},
        },
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "smollm2"


def test_sdk_raw_stream_with_stop_sequence(anthropic_client: anthropic.Anthropic) -> None:
    stops = stop_letters(anthropic_client)
    events: list[RawMessageStreamEvent] = list(
        anthropic_client.messages.create(
            model=CHAT_MODEL,
            max_tokens=60,
            extra_body=GREEDY,
            stop_sequences=stops,
            messages=WEATHER_TODAY,
            stream=True,
        )
    )
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.type == "message_delta"
    assert delta.delta.stop_reason == "stop_sequence" and delta.delta.stop_sequence in stops


def test_embedding_model_is_400(anthropic_client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        anthropic_client.messages.create(model=EMBED_MODEL, max_tokens=8, messages=HELLO)
    check_error(info.value, 400, "invalid_request_error")


def test_openai_routes_keep_openai_errors(gateway: GatewayProcess) -> None:
    r = httpx.post(
        f"{gateway.url}/v1/chat/completions", json={"model": "no-such-model", "messages": []}, timeout=60
    )
    assert r.status_code in (400, 404) and "type" not in r.json() and r.json()["error"]["message"]


def test_metrics_count_messages(anthropic_client: anthropic.Anthropic, gateway: GatewayProcess) -> None:
    def requests() -> float:
        value = metric(
            scrape(gateway.url), "raygate:http_requests_total", endpoint="/v1/messages", status="200"
        )
        return value or 0.0

    before = requests()
    anthropic_client.messages.create(model=CHAT_MODEL, max_tokens=2, messages=HELLO)
    # Counted once the response has gone out, so maybe just after the client has read it.
    wait_for(lambda: requests() >= before + 1, timeout=10, what="the request's count")
    assert requests() == before + 1


# -- errors that need the operations gateway (keys, limits, fault injection) ----------------------


@pytest.fixture
def ops_client(ops_gateway: GatewayProcess) -> Iterator[anthropic.Anthropic]:
    """The SDK with the unrestricted key, sent as `x-api-key` (the SDK's default)."""
    with anthropic.Anthropic(base_url=ops_gateway.url, api_key=ADMIN_KEY, max_retries=0, timeout=120) as c:
        yield c


def test_keys_as_x_api_key_or_bearer(ops_gateway: GatewayProcess, ops_client: anthropic.Anthropic) -> None:
    assert ops_client.messages.create(model="smollm2", max_tokens=2, messages=HELLO).type == "message"
    with anthropic.Anthropic(base_url=ops_gateway.url, auth_token=ADMIN_KEY, max_retries=0) as bearer:
        assert bearer.messages.count_tokens(model="smollm2", messages=HELLO).input_tokens > 0
    with anthropic.Anthropic(base_url=ops_gateway.url, api_key="sk-wrong-0123456789", max_retries=0) as bad:
        with pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.create(model="smollm2", max_tokens=2, messages=HELLO)
    check_error(info.value, 401, "authentication_error")
    url = f"{ops_gateway.url}/v1/messages/count_tokens"
    body = {"model": "smollm2", "messages": HELLO}
    missing = httpx.post(url, json=body, timeout=60)
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    clash = httpx.post(
        url, json=body, headers={"x-api-key": ADMIN_KEY, "Authorization": f"Bearer {SMOLLM_KEY}"}, timeout=60
    )
    assert clash.status_code == 401 and "different keys" in clash.json()["error"]["message"]
    # The OpenAI routes take x-api-key too, and keep OpenAI's error body.
    ok = httpx.get(f"{ops_gateway.url}/v1/models", headers={"x-api-key": ADMIN_KEY}, timeout=60)
    assert ok.status_code == 200
    refused = httpx.get(
        f"{ops_gateway.url}/v1/models", headers={"x-api-key": "sk-wrong-0123456789"}, timeout=60
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_key_without_access_is_403(ops_gateway: GatewayProcess) -> None:
    with anthropic.Anthropic(base_url=ops_gateway.url, api_key=SMOLLM_KEY, max_retries=0) as limited:
        with pytest.raises(anthropic.PermissionDeniedError) as info:
            limited.messages.create(model="synth", max_tokens=2, messages=HELLO)
    check_error(info.value, 403, "permission_error")


def test_rate_limited_key_is_429(ops_gateway: GatewayProcess) -> None:
    with anthropic.Anthropic(base_url=ops_gateway.url, api_key=MESSAGES_LIMITED_KEY, max_retries=0) as slow:
        with pytest.raises(anthropic.RateLimitError) as info:
            for _ in range(4):  # 2 requests per minute, however many were spent before
                slow.messages.count_tokens(model="smollm2", messages=HELLO)
    check_error(info.value, 429, "rate_limit_error")
    assert int(info.value.response.headers["retry-after"]) >= 1


def test_body_too_large_is_413(ops_gateway: GatewayProcess) -> None:
    big = [{"role": "user", "content": "x" * (MAX_BODY + 1)}]
    r = httpx.post(
        f"{ops_gateway.url}/v1/messages",
        json={"model": "smollm2", "max_tokens": 2, "messages": big},
        headers={"x-api-key": ADMIN_KEY},
        timeout=60,
    )
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_first_token_timeout_is_504(ops_client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.InternalServerError) as info:
        ops_client.messages.create(model="synth-slow-start", max_tokens=2, messages=HELLO)
    check_error(info.value, 504, "timeout_error")


def test_failure_mid_stream_is_an_error_event(
    ops_gateway: GatewayProcess, ops_client: anthropic.Anthropic
) -> None:
    """synth-fail raises after its 3rd token: the stream's last event is `error`, nothing follows."""
    events = raw_events(
        ops_gateway,
        {"model": "synth-fail", "max_tokens": 10, "messages": HELLO},
        headers={"x-api-key": ADMIN_KEY},
    )
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-1] == "error" and "message_stop" not in names
    assert events[-1][1]["error"]["type"] == "api_error"
    assert "synthetic engine failure" in events[-1][1]["error"]["message"]
    with pytest.raises(anthropic.APIStatusError, match="synthetic engine failure"):
        for _ in ops_client.messages.create(model="synth-fail", max_tokens=10, messages=HELLO, stream=True):
            pass
    with pytest.raises(anthropic.InternalServerError) as info:
        ops_client.messages.create(model="synth-fail", max_tokens=10, messages=HELLO)
    check_error(info.value, 500, "api_error")
