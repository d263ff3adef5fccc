"""Ollama's API on the default (llama.cpp) gateway: the suite every backend passes
(tests/support/suites/ollama.py; tests/e2e/vllm/test_vllm_ollama.py reruns it on vLLM), then
what is checked here only: the metrics of an Ollama request, and what needs the operations
gateway (keys and per-key models, a failure after the first line, a client that leaves, and
`/api/delete` undeploying a model).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import pytest

from tests.support.admin import deployments, wait_deployment
from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL
from tests.support.ops import ADMIN_KEY, SMOLLM_KEY, metric, scrape, wait_for
from tests.support.reasoning import MODEL as REASONER
from tests.support.suites.ollama import (  # noqa: F401
    HELLO,
    ndjson,
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
from tests.support.suites.ollama import (
    client as ollama_client,
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
    # Counted once the response has gone out, so maybe just after the client has read it.
    wait_for(lambda: requests() >= before + 1, timeout=10, what="the request's count")
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


# -- `think` on a reasoning model ------------------------------------------------------------------
#
# `tiny-reasoner`'s template opens `<think>` in the prompt, so with thinking on every answer begins
# in thinking. Each Ollama answer is compared with `/v1/chat/completions` asked the same way (the
# same greedy request on the same replica): Ollama's `think` is chat's switch or effort, and its
# `thinking` / `content` are chat's `reasoning_content` / `content`, never what the model wrote.

THINK_OPTIONS = {"temperature": 0, "num_predict": 12}
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def _v1_chat(gateway: GatewayProcess, **fields: Any) -> dict[str, Any]:
    body = {"model": REASONER, "messages": QUESTION, "temperature": 0, "max_tokens": 12, **fields}
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    reply: dict[str, Any] = answer.json()
    return reply


def _no_markers(*texts: str | None) -> None:
    for text in texts:
        assert "<think>" not in (text or "") and "</think>" not in (text or "")


@pytest.mark.parametrize(
    ("think", "v1"),
    [
        (True, {"chat_template_kwargs": {"enable_thinking": True}}),
        (None, {}),  # unset: the model's default (on for tiny-reasoner), still split
        ("low", {"reasoning_effort": "low"}),
        ("high", {"reasoning_effort": "high"}),
    ],
)
def test_chat_thinking_apart_from_the_answer(
    gateway: GatewayProcess, reasoner: str, think: bool | str | None, v1: dict[str, Any]
) -> None:
    with ollama_client(gateway) as c:
        reply = c.chat(model=reasoner, messages=QUESTION, think=think, options=THINK_OPTIONS)  # type: ignore[arg-type]
    chat = _v1_chat(gateway, **v1)
    expected = chat["choices"][0]["message"]
    assert reply.message.thinking  # the template opened the thinking: there is some
    assert reply.message.thinking == expected["reasoning_content"]
    assert reply.message.content == (expected["content"] or "")
    _no_markers(reply.message.thinking, reply.message.content)
    assert reply.eval_count == chat["usage"]["completion_tokens"]
    assert reply.done_reason == ("length" if chat["choices"][0]["finish_reason"] == "length" else "stop")


def test_chat_thinking_streamed_piece_by_piece(gateway: GatewayProcess, reasoner: str) -> None:
    with ollama_client(gateway) as c:
        whole = c.chat(model=reasoner, messages=QUESTION, think=True, options=THINK_OPTIONS)
        parts = list(
            c.chat(model=reasoner, messages=QUESTION, think=True, options=THINK_OPTIONS, stream=True)
        )
    thought = "".join(p.message.thinking or "" for p in parts)
    answer = "".join(p.message.content or "" for p in parts)
    assert sum(1 for p in parts if p.message.thinking) >= 1
    assert thought == whole.message.thinking and answer == whole.message.content
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count
    # The raw lines: `thinking` inside `message`, absent from a line that carries none.
    lines = ndjson(
        gateway,
        "/api/chat",
        {"model": reasoner, "messages": QUESTION, "think": True, "options": THINK_OPTIONS},
    )
    assert "".join(line["message"].get("thinking", "") for line in lines) == whole.message.thinking
    assert "thinking" not in lines[-1]["message"]


def test_chat_think_false_has_no_thinking(gateway: GatewayProcess, reasoner: str) -> None:
    expected = _v1_chat(gateway, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert "reasoning_content" not in expected
    with ollama_client(gateway) as c:
        reply = c.chat(model=reasoner, messages=QUESTION, think=False, options=THINK_OPTIONS)
        parts = list(
            c.chat(model=reasoner, messages=QUESTION, think=False, options=THINK_OPTIONS, stream=True)
        )
    assert reply.message.thinking is None and reply.message.content == expected["content"]
    assert all(p.message.thinking is None for p in parts)
    assert "".join(p.message.content or "" for p in parts) == reply.message.content
    _no_markers(reply.message.content)


def test_generate_thinking_at_the_top_level(gateway: GatewayProcess, reasoner: str) -> None:
    with ollama_client(gateway) as c:
        whole = c.generate(model=reasoner, prompt="What is 2+2?", think=True, options=THINK_OPTIONS)
        parts = list(
            c.generate(model=reasoner, prompt="What is 2+2?", think=True, options=THINK_OPTIONS, stream=True)
        )
        off = c.generate(model=reasoner, prompt="What is 2+2?", think=False, options=THINK_OPTIONS)
    expected = _v1_chat(gateway, chat_template_kwargs={"enable_thinking": True})["choices"][0]["message"]
    assert whole.thinking and whole.thinking == expected["reasoning_content"]
    assert whole.response == (expected["content"] or "")
    assert "".join(p.thinking or "" for p in parts) == whole.thinking
    assert "".join(p.response for p in parts) == whole.response
    assert off.thinking is None
    _no_markers(whole.thinking, whole.response, off.response)


def test_think_on_a_model_without_thinking_is_ollamas_400(gateway: GatewayProcess, reasoner: str) -> None:
    with ollama_client(gateway) as c:
        for think in (True, "medium"):
            with pytest.raises(ollama.ResponseError) as info:
                c.chat(model=CHAT_MODEL, messages=HELLO, think=think, options={"num_predict": 2})  # type: ignore[arg-type]
            assert info.value.status_code == 400
            assert info.value.error == f'"{CHAT_MODEL}" does not support thinking'
        with pytest.raises(ollama.ResponseError) as info:
            c.generate(model=CHAT_MODEL, prompt="hi", think=True, options={"num_predict": 2})
        assert info.value.status_code == 400
        # `false` is accepted (nothing to switch off), and a raw prompt skips the template that
        # switches thinking: it takes `false` only.
        assert c.chat(model=CHAT_MODEL, messages=HELLO, think=False, options={"num_predict": 2}).done
        with pytest.raises(ollama.ResponseError) as info:
            c.generate(model=reasoner, prompt="2+2=", raw=True, think=True, options={"num_predict": 2})
        assert info.value.status_code == 400 and "raw" in info.value.error
        shown, plain = c.show(reasoner), c.show(CHAT_MODEL)
    assert shown.capabilities is not None and "thinking" in shown.capabilities
    assert plain.capabilities is not None and "thinking" not in plain.capabilities
