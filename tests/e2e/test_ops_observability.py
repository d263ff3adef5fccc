"""Metrics, readiness, request ids, logs and SSE pings, on the default gateway's real models and on
the operations gateway (tests/support/ops.py)."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import openai
import yaml

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL, DEFAULT_CONFIG, EMBED_MODEL
from tests.support.ops import ADMIN_KEY, metric, scrape, wait_for
from tests.support.replicas import replica_stats


def test_metrics_count_a_real_chat(client: openai.OpenAI, gateway: GatewayProcess) -> None:
    before = scrape(gateway.url)
    labels = {"model_name": CHAT_MODEL}
    r = client.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
    )
    assert r.usage is not None
    after = scrape(gateway.url)

    def grew(name: str, **extra: str) -> float:
        return (metric(after, name, **labels, **extra) or 0) - (metric(before, name, **labels, **extra) or 0)

    assert grew("raygate:time_to_first_token_seconds_count") == 1
    assert grew("raygate:e2e_request_latency_seconds_count") == 1
    assert grew("raygate:request_queue_time_seconds_count") == 1
    assert grew("raygate:prompt_tokens_total") == r.usage.prompt_tokens
    assert grew("raygate:generation_tokens_total") == r.usage.completion_tokens
    assert grew("raygate:http_requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert grew("raygate:request_success_total", finished_reason=r.choices[0].finish_reason) == 1
    if r.usage.completion_tokens > 1:
        assert grew("raygate:time_per_output_token_seconds_count") == 1
    assert metric(after, "raygate:num_requests_running", **labels) == 0
    assert metric(after, "raygate:num_requests_waiting", **labels) == 0
    assert metric(after, "raygate:replicas_ready", **labels) == 1
    assert metric(after, "raygate:replica_restarts_total", **labels) == 0
    # The llama.cpp engine looked the prompt up in its prompt cache: one hit or one miss.
    looked_up = grew("raygate:prompt_cache_hits_total") + grew("raygate:prompt_cache_misses_total")
    assert looked_up == 1
    assert grew("raygate:prompt_cache_reused_tokens_total") <= r.usage.prompt_tokens
    # Prefixes restored from host memory (an evicted slot's state): counted per model.
    assert metric(after, "raygate:prompt_cache_restored_total", **labels) is not None
    # The forward passes that answered it, and the time inside them.
    passes = grew("raygate:forward_passes_total")
    assert grew("raygate:forward_tokens_total") >= passes >= 1
    assert grew("raygate:forward_seconds_total") > 0
    # vLLM's bucket layout, rendered as a Prometheus histogram.
    assert metric(after, "raygate:time_to_first_token_seconds_bucket", **labels, le="+Inf") is not None
    # An opening whose slot other conversations took comes back from host memory: one restore.
    assert restores_after_eviction(client, gateway) == 1


def restores_after_eviction(client: openai.OpenAI, gateway: GatewayProcess) -> float:
    """One conversation's turn, then twice as many other conversations as the replica has
    prompt-cache slots (models/default.yaml's `n_seq_max`): each new prompt takes the least
    recently used slot, so the first round alone overwrites every slot, the opening's too, whose
    state goes to host memory before (the second round is margin, should a prompt take a slot for
    a prefix it shares instead). Then the first conversation's next turn: no slot shares more
    than its first few tokens, the stored state shares its whole opening, so that state is copied
    back into a slot, once (backends/engines/llama_cpp/batched.py, `_admit`). Returns how much the
    model's restore counter grew over that turn. A nonce first in every prompt keeps the slots and
    stored states of earlier requests (a rerun's too) out of the way."""
    engine = next(
        m["engine"] for m in yaml.safe_load(DEFAULT_CONFIG.read_text())["models"] if m["name"] == CHAT_MODEL
    )
    nonce = uuid.uuid4().hex[:8]
    opening = f"{nonce} You are a careful assistant who answers plainly, in one short sentence. " * 3

    def ask(system: str, question: str) -> None:
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=1,
        )

    ask(opening, "Name a river.")
    for i in range(2 * engine["n_seq_max"]):
        ask(f"{nonce}-{i} Another conversation, about something else entirely: topic number {i}. " * 2, "Hi.")
    before = metric(scrape(gateway.url), "raygate:prompt_cache_restored_total", model_name=CHAT_MODEL) or 0
    ask(opening, "Name a mountain.")
    after = metric(scrape(gateway.url), "raygate:prompt_cache_restored_total", model_name=CHAT_MODEL) or 0
    return after - before


def test_a_repeated_prompt_comes_whole_from_the_cache(client: openai.OpenAI, gateway: GatewayProcess) -> None:
    """The same chat request twice: the second reuses every prompt token, its first token drawn
    from the logits the replica kept with the prompt (no decode), and answers the same."""
    messages = [{"role": "user", "content": "Repeat after me, observability check: the cache holds."}]

    def ask() -> tuple[str | None, int, int]:
        r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        assert r.usage is not None
        details = r.usage.prompt_tokens_details  # absent when nothing was cached
        return r.choices[0].message.content, r.usage.prompt_tokens, (details and details.cached_tokens) or 0

    first = ask()
    before = (
        metric(scrape(gateway.url), "raygate:prompt_cache_logits_reused_total", model_name=CHAT_MODEL) or 0
    )
    again = ask()
    after = metric(scrape(gateway.url), "raygate:prompt_cache_logits_reused_total", model_name=CHAT_MODEL)
    assert again[0] == first[0]
    assert again[2] == again[1] == first[1]
    assert after == before + 1
    # The Responses API reports the same count as `input_tokens_details.cached_tokens`.
    for _ in range(2):
        r = client.responses.create(
            model=CHAT_MODEL,
            input="Repeat after me: responses count cached input.",
            max_output_tokens=16,
            store=False,
        )
    assert r.usage is not None and r.usage.input_tokens_details.cached_tokens == r.usage.input_tokens > 0


def test_metrics_content_type(gateway: GatewayProcess) -> None:
    r = httpx.get(f"{gateway.url}/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE raygate:time_to_first_token_seconds histogram" in r.text


def test_health_and_ready(client: openai.OpenAI, gateway: GatewayProcess) -> None:
    """The embedding model loads on its first request (models/default.yaml): after one, both
    models have their replica, in /ready and in the replicas gauge."""
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    assert client.embeddings.create(model=EMBED_MODEL, input="wake up").data[0].embedding
    r = httpx.get(f"{gateway.url}/ready")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "replicas": {CHAT_MODEL: 1, EMBED_MODEL: 1}}
    assert metric(scrape(gateway.url), "raygate:replicas_ready", model_name=EMBED_MODEL) == 1


def test_request_id_is_kept_generated_or_replaced(ops_gateway: GatewayProcess, admin: httpx.Client) -> None:
    kept = admin.get("/v1/models", headers={"X-Request-Id": "trace-42.a:b"})
    assert kept.headers["x-request-id"] == "trace-42.a:b"
    generated = admin.get("/v1/models")
    assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["x-request-id"])
    for bad in ("has space", "x" * 129, "a/b", "<script>"):
        replaced = admin.get("/v1/models", headers={"X-Request-Id": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"]), bad
    # Refusals carry it too (401 before any route ran).
    refused = httpx.get(f"{ops_gateway.url}/v1/models", headers={"X-Request-Id": "refused-1"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "refused-1"


def test_request_id_is_the_engine_request_id_prefix(admin: httpx.Client) -> None:
    body = {"model": "synth-kill", "prompt": "x", "max_tokens": 200, "stream": True}
    with admin.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": "engine-trace-7"}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # keep a reference: a collected line iterator closes the response
        while not next(lines).startswith("data: "):
            pass
        running = [i for s in replica_stats("synth-kill") for i in s.running_ids]
    assert any(i.startswith("engine-trace-7/cmpl-") for i in running), running


def test_json_logs_carry_the_request_id(ops_gateway: GatewayProcess, admin: httpx.Client) -> None:
    admin.post(
        "/v1/completions",
        json={"model": "synth", "prompt": "x", "max_tokens": 2},
        headers={"X-Request-Id": "log-check-1"},
    ).raise_for_status()

    def access_line() -> dict[str, object] | None:
        for line in ops_gateway.log().splitlines():
            if line.startswith("{") and '"log-check-1"' in line:
                record = json.loads(line)
                if record["logger"] == "raygate.access":
                    return record
        return None

    wait_for(access_line, timeout=10, what="the access log line")
    record = access_line()
    assert record is not None
    assert record["request_id"] == "log-check-1"
    assert record["status"] == 200 and record["model"] == "synth" and record["key_name"] == "admin"
    assert ADMIN_KEY not in ops_gateway.log()


def test_sse_keepalive_is_a_comment(ops_gateway: GatewayProcess, admin: httpx.Client) -> None:
    """synth-kill sends 20 tokens/s for 1.5 s; the gateway pings every 0.3 s."""
    body = {"model": "synth-kill", "prompt": "x", "max_tokens": 30, "stream": True}
    with admin.stream("POST", "/v1/completions", json=body) as r:
        lines = list(r.iter_lines())
    pings = [line for line in lines if line.startswith(":")]
    data = [line for line in lines if line.startswith("data:")]
    assert pings and set(pings) == {": ping"}
    assert all(line[len("data:") :].strip() for line in data), "an empty data: event"
    assert data[-1] == "data: [DONE]" and len(data) == 31
    # The openai SDK reads the same stream with its pings.
    with openai.OpenAI(base_url=f"{ops_gateway.url}/v1", api_key=ADMIN_KEY, max_retries=0) as c:
        text = "".join(
            ch.choices[0].text
            for ch in c.completions.create(model="synth-kill", prompt="x", max_tokens=30, stream=True)
        )
    assert text == " tok" * 30


def test_grafana_dashboard_uses_exported_metrics(gateway: GatewayProcess) -> None:
    from tests.support.gateway import REPO

    dashboard = json.loads((REPO / "grafana" / "raygate-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {
        re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"raygate:[a-z0-9_]+", e)
    }
    exported = set(re.findall(r"^# TYPE (raygate:[a-z0-9_]+) ", scrape(gateway.url), re.MULTILINE))
    assert used and used <= exported, used - exported
    # Every exported metric is on the dashboard.
    assert exported <= used, exported - used
