"""Ollama's API on the default (llama.cpp) gateway: the suite every backend passes
(tests/support/suites/ollama.py; tests/e2e/vllm/test_vllm_ollama.py reruns it on vLLM), then
what is checked here only: the metrics of an Ollama request, and what needs the operations
gateway (keys and per-key models, a failure after the first line, a client that leaves, and
`/api/delete` undeploying a model).
"""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from tests.support.admin import deployments, wait_deployment
from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL
from tests.support.ops import ADMIN_KEY, SMOLLM_KEY, metric, scrape, wait_for
from tests.support.suites.ollama import (  # noqa: F401
    HELLO,
    test_bad_inputs_are_400_in_ollamas_body,
    test_chat_stream_lines_parse_and_end_with_done,
    test_chat_whole_counts_are_the_engines,
    test_curl_streams_ndjson,
    test_embed_and_embeddings,
    test_format_schema_and_json,
    test_generate_templated_raw_and_streamed,
    test_langchain_chat_ollama_and_embeddings,
    test_malformed_body_is_400,
    test_root_and_version_probes,
    test_tags_show_ps,
    test_tools_forced_call_and_round_trip,
    test_unknown_model_is_ollamas_404,
)


def test_metrics_count_ollama_requests(gateway: GatewayProcess) -> None:
    def requests() -> float:
        value = metric(scrape(gateway.url), "raygate:http_requests_total", endpoint="/api/chat", status="200")
        return value or 0.0

    def tokens() -> float:
        return metric(scrape(gateway.url), "raygate:generation_tokens_total", model_name=CHAT_MODEL) or 0.0

    before, made = requests(), tokens()
    with ollama.Client(host=gateway.url, timeout=300) as c:
        reply = c.chat(model=CHAT_MODEL, messages=HELLO, options={"num_predict": 2})
    assert requests() == before + 1
    assert tokens() == made + (reply.eval_count or 0)


# -- the operations gateway ------------------------------------------------------------------------


def test_keys_as_on_v1(ops_gateway: GatewayProcess) -> None:
    url = ops_gateway.url
    refused = httpx.post(f"{url}/api/chat", json={"model": "synth", "messages": HELLO}, timeout=30)
    assert refused.status_code == 401 and isinstance(refused.json()["error"], str)
    assert httpx.get(f"{url}/api/tags", timeout=30).status_code == 401
    assert httpx.get(f"{url}/api/version", timeout=30).status_code == 200  # the probe stays open
    assert httpx.get(f"{url}/", timeout=30).status_code == 200
    with ollama.Client(host=url, headers={"Authorization": f"Bearer {SMOLLM_KEY}"}, timeout=120) as limited:
        names = {m.model for m in limited.list().models}
        with pytest.raises(ollama.ResponseError) as err:
            limited.chat(model="synth", messages=HELLO)
    assert "smollm2" in names and "synth" not in names
    assert err.value.status_code == 403
    with ollama.Client(host=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120) as full:
        assert full.chat(model="synth", messages=HELLO, options={"num_predict": 3}).done


def test_failure_after_the_first_line_is_an_error_line(ops_gateway: GatewayProcess) -> None:
    body = {"model": "synth-fail", "messages": HELLO, "options": {"num_predict": 20}}
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.stream(
        "POST", f"{ops_gateway.url}/api/chat", json=body, headers=headers, timeout=60
    ) as answer:
        assert answer.status_code == 200
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    assert lines[0]["done"] is False and set(lines[-1]) == {"error"}
    with (
        ollama.Client(host=ops_gateway.url, headers=headers, timeout=60) as client,
        pytest.raises(ollama.ResponseError) as err,
    ):
        list(client.chat(model="synth-fail", messages=HELLO, stream=True, options={"num_predict": 20}))
    assert err.value.error == lines[-1]["error"]


def test_client_that_leaves_frees_its_slot(ops_gateway: GatewayProcess) -> None:
    """A stream closed after its first line ends the request (the running gauge returns to 0)."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"model": "synth-long", "messages": HELLO, "options": {"num_predict": 200}}
    with httpx.stream(
        "POST", f"{ops_gateway.url}/api/chat", json=body, headers=headers, timeout=60
    ) as answer:
        assert json.loads(next(answer.iter_lines()))["done"] is False

    def idle() -> bool:
        return metric(scrape(ops_gateway.url), "raygate:num_requests_running", model_name="synth-long") == 0

    wait_for(idle, timeout=30, what="the abandoned stream to end")


def test_delete_undeploys(ops_gateway: GatewayProcess) -> None:
    url = ops_gateway.url
    spec = {"name": "ollama-doomed", "backend": "synthetic", "num_cpus": 0}
    assert httpx.post(f"{url}/admin/deployments", json=spec, timeout=30).status_code == 202
    wait_deployment(url, "ollama-doomed", lambda s: s["state"] == "ready")
    with ollama.Client(host=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120) as client:
        assert client.delete("ollama-doomed:latest").status == "success"
        assert "ollama-doomed" not in deployments(url)
        with pytest.raises(ollama.ResponseError) as err:
            client.delete("ollama-doomed")
    assert err.value.status_code == 404
