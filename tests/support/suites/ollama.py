"""Ollama's API through the real `ollama` Python client, LangChain's `ChatOllama` and
`OllamaEmbeddings`, and curl: chat and generate (streamed and whole), embed, tags, show, ps,
tools, a format schema, the probes, and bad inputs answered as Ollama answers them.

Assertions are about what the feature guarantees (every NDJSON line parses, only the last is
`done`, its counts are the engine's: the prompt's tokens as `/tokenize` counts them, exactly
`num_predict` tokens when it stopped for length), never the words a tiny model writes, nor times.
A suite every backend passes: tests/e2e/test_ollama.py runs it on the default (llama.cpp)
gateway, tests/e2e/vllm/test_vllm_ollama.py on vLLM.
"""

from __future__ import annotations

import json
import math
import subprocess
from typing import Any

import httpx
import jsonschema
import ollama
import pytest
from langchain_ollama import ChatOllama, OllamaEmbeddings

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.structured import max_call_bytes, max_json_bytes
from tests.support.tools import WEATHER_PARAMS

HELLO = [{"role": "user", "content": "Say hello."}]
BUDGET = 4  # num_predict of the plain answers: short on a loaded CPU
GREEDY = {"temperature": 0, "num_predict": BUDGET}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS},
}
CALL_TOKENS = max_call_bytes([WEATHER])
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


def client(gateway: GatewayProcess) -> ollama.Client:
    """The client as a tool would make it; use it in a `with` block (it holds a connection)."""
    return ollama.Client(host=gateway.url, timeout=300)


def check_done(last: dict[str, Any] | Any, budget: int) -> None:
    """The `done` line's fields: Ollama's reasons, real counts, durations in nanoseconds."""
    assert last["done"] is True and last["done_reason"] in ("stop", "length")
    assert last["prompt_eval_count"] > 0 and 0 < last["eval_count"] <= budget
    if last["done_reason"] == "length":
        assert last["eval_count"] == budget
    for name in DURATIONS:
        assert isinstance(last[name], int) and last[name] >= 0
    parts = last["load_duration"] + last["prompt_eval_duration"] + last["eval_duration"]
    assert last["total_duration"] >= parts > 0


def prompt_tokens(gateway: GatewayProcess, messages: list[dict[str, str]]) -> int:
    """The chat template's token count of `messages` (vLLM's `/tokenize`, the engine's own)."""
    body = {"model": CHAT_MODEL, "messages": messages, "add_generation_prompt": True}
    answer = httpx.post(f"{gateway.url}/tokenize", json=body, timeout=120)
    answer.raise_for_status()
    count: int = answer.json()["count"]
    return count


def ndjson(gateway: GatewayProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{gateway.url}{path}", json=body, timeout=300) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"] == "application/x-ndjson"
        return [json.loads(line) for line in answer.iter_lines() if line]


# -- probes and listings -------------------------------------------------------------------------


def test_root_and_version_probes(gateway: GatewayProcess) -> None:
    root = httpx.get(gateway.url + "/", timeout=30)
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert httpx.head(gateway.url + "/", timeout=30).status_code == 200
    head = subprocess.run(
        ["curl", "-sSI", gateway.url + "/"], capture_output=True, text=True, timeout=60, check=True
    )
    assert head.stdout.startswith("HTTP/1.1 200")
    assert httpx.get(gateway.url + "/api/version", timeout=30).json()["version"].count(".") == 2


def test_tags_show_ps(gateway: GatewayProcess) -> None:
    with client(gateway) as c:
        names = {m.model for m in c.list().models}
        shown = c.show(f"{CHAT_MODEL}:latest")  # `name:latest` is `name`
        embedder = c.show(EMBED_MODEL)
        running = {m.model: m for m in c.ps().models}
    assert {CHAT_MODEL, EMBED_MODEL} <= names
    models = httpx.get(f"{gateway.url}/v1/models", timeout=30).json()["data"]
    assert names == {m["id"] for m in models}  # names as /v1/models lists them
    assert shown.capabilities is not None and "completion" in shown.capabilities
    assert shown.modelinfo is not None
    contexts = [v for k, v in shown.modelinfo.items() if k.endswith(".context_length")]
    assert contexts and contexts[0] > 0
    assert shown.details is not None and shown.details.format
    assert embedder.capabilities == ["embedding"]
    assert CHAT_MODEL in running and (running[CHAT_MODEL].context_length or 0) == contexts[0]


# -- chat and generate ----------------------------------------------------------------------------


def test_chat_whole_counts_are_the_engines(gateway: GatewayProcess) -> None:
    with client(gateway) as c:
        reply = c.chat(model=CHAT_MODEL, messages=HELLO, options=GREEDY)
    assert reply.message.role == "assistant" and isinstance(reply.message.content, str)
    check_done(reply, BUDGET)
    assert reply.prompt_eval_count == prompt_tokens(gateway, HELLO)


def test_chat_stream_lines_parse_and_end_with_done(gateway: GatewayProcess) -> None:
    lines = ndjson(gateway, "/api/chat", {"model": CHAT_MODEL, "messages": HELLO, "options": GREEDY})
    *pieces, last = lines
    assert pieces and all(p["done"] is False and p["message"]["role"] == "assistant" for p in pieces)
    assert all(p["model"] == CHAT_MODEL and p["created_at"].endswith("Z") for p in lines)
    check_done(last, BUDGET)
    assert len(pieces) <= last["eval_count"]  # a line per delta, a delta per token at most
    assert last["prompt_eval_count"] == prompt_tokens(gateway, HELLO)
    # The ollama client reads the same stream.
    with client(gateway) as c:
        parts = list(c.chat(model=CHAT_MODEL, messages=HELLO, options=GREEDY, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    check_done(parts[-1], BUDGET)


def test_generate_templated_raw_and_streamed(gateway: GatewayProcess) -> None:
    with client(gateway) as c:
        whole = c.generate(model=CHAT_MODEL, prompt="Say hello.", system="Be brief.", options=GREEDY)
        raw = c.generate(model=CHAT_MODEL, prompt="1, 2, 3,", raw=True, options=GREEDY)
        parts = list(c.generate(model=CHAT_MODEL, prompt="Say hello.", options=GREEDY, stream=True))
        loaded = c.generate(model=CHAT_MODEL)  # no prompt: Ollama's "load the model"
    check_done(whole, BUDGET)
    assert whole.context is None  # none is returned, so none can be sent back (docs/api/ollama.md)
    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    assert whole.prompt_eval_count == prompt_tokens(gateway, ask)
    check_done(raw, BUDGET)
    assert raw.prompt_eval_count < whole.prompt_eval_count  # no template around it
    assert parts[-1].done and all(isinstance(p.response, str) for p in parts)
    check_done(parts[-1], BUDGET)
    assert loaded.done and loaded.done_reason == "load"


def test_curl_streams_ndjson(gateway: GatewayProcess) -> None:
    body = json.dumps({"model": CHAT_MODEL, "prompt": "Say hello.", "options": GREEDY})
    # `curl -d` sends a form Content-Type: Ollama reads the body as JSON all the same.
    out = subprocess.run(
        ["curl", "-sSN", "-d", body, f"{gateway.url}/api/generate"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])
    check_done(lines[-1], BUDGET)


def test_format_schema_and_json(gateway: GatewayProcess) -> None:
    budget = max_json_bytes(ANSWER_SCHEMA)
    ask = [{"role": "user", "content": "Is the sky blue? Answer as JSON."}]
    with client(gateway) as c:
        reply = c.chat(
            model=CHAT_MODEL,
            messages=ask,
            format=ANSWER_SCHEMA,
            options={"temperature": 0, "num_predict": budget},
        )
        loose = c.generate(
            model=CHAT_MODEL, prompt="Give a JSON object.", format="json", options={"num_predict": 24}
        )
    assert reply.done_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content or ""), ANSWER_SCHEMA)
    if loose.done_reason == "stop":  # an object may be longer than the budget
        assert isinstance(json.loads(loose.response or ""), dict)
    else:
        assert (loose.response or "").lstrip().startswith("{")


def test_tools_forced_call_and_round_trip(gateway: GatewayProcess) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Ollama's calls are always `auto`; Raygate's `tool_choice` extension forces one, so a call is
    # certain on a tiny model.
    body = {
        "model": CHAT_MODEL,
        "messages": ask,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stream": False,
        "options": {"temperature": 0, "num_predict": CALL_TOKENS},
    }
    reply = httpx.post(f"{gateway.url}/api/chat", json=body, timeout=300).json()
    calls = reply["message"]["tool_calls"]
    assert reply["done_reason"] == "stop" and len(calls) >= 1
    assert calls[0]["function"]["name"] == "get_weather"
    jsonschema.validate(calls[0]["function"]["arguments"], WEATHER_PARAMS)  # an object, not text
    streamed = ndjson(gateway, "/api/chat", {**body, "stream": True})
    call_lines = [line for line in streamed if line["message"].get("tool_calls")]
    assert len(call_lines) == 1 and not call_lines[0]["done"]
    jsonschema.validate(call_lines[0]["message"]["tool_calls"][0]["function"]["arguments"], WEATHER_PARAMS)
    # The client sends the call and its result back; Ollama's tool turns name the tool, not an id.
    history = [
        *ask,
        {"role": "assistant", "content": "", "tool_calls": [{"function": calls[0]["function"]}]},
        {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"},
    ]
    with client(gateway) as c:
        answer = c.chat(model=CHAT_MODEL, messages=history, tools=[WEATHER], options=GREEDY)
    check_done(answer, BUDGET)
    for call in answer.message.tool_calls or ():
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)


# -- embeddings -----------------------------------------------------------------------------------


def test_embed_and_embeddings(gateway: GatewayProcess) -> None:
    with client(gateway) as c:
        embedded = c.embed(model=EMBED_MODEL, input=["a cat", "a dog"])
        older = c.embeddings(model=EMBED_MODEL, prompt="a cat").embedding
        short = c.embed(model=f"{EMBED_MODEL}:latest", input="a cat", dimensions=8).embeddings[0]
    assert len(embedded.embeddings) == 2 and (embedded.prompt_eval_count or 0) > 0
    for vector in embedded.embeddings:
        assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-3)
    openai_way = httpx.post(
        f"{gateway.url}/v1/embeddings", json={"model": EMBED_MODEL, "input": "a cat"}, timeout=120
    ).json()["data"][0]["embedding"]
    assert all(
        math.isclose(a, b, abs_tol=1e-4) for a, b in zip(embedded.embeddings[0], openai_way, strict=True)
    )
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(older, openai_way, strict=True))
    assert len(short) == 8


def test_langchain_chat_ollama_and_embeddings(gateway: GatewayProcess) -> None:
    # LangChain makes its own ollama clients and closes none: closed here (the async ones
    # never open a connection in sync calls).
    llm = ChatOllama(model=CHAT_MODEL, base_url=gateway.url, temperature=0, num_predict=BUDGET)
    emb = OllamaEmbeddings(model=EMBED_MODEL, base_url=gateway.url)
    try:
        reply = llm.invoke("Say hello.")
        chunks = list(llm.stream("Say hello."))
        documents = emb.embed_documents(["a cat", "a dog"])
        query = emb.embed_query("a cat")
    finally:
        llm._client.close()
        emb._client.close()
    assert isinstance(reply.content, str)
    assert reply.usage_metadata is not None and 0 < reply.usage_metadata["output_tokens"] <= BUDGET
    assert chunks and all(isinstance(c.content, str) for c in chunks)
    assert any(c.usage_metadata for c in chunks)  # from the done line's counts
    assert len(documents) == 2 and len(query) == len(documents[0]) > 0


# -- bad inputs, as Ollama answers them -----------------------------------------------------------


def post(gateway: GatewayProcess, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, timeout=120)


def test_unknown_model_is_ollamas_404(gateway: GatewayProcess) -> None:
    with client(gateway) as c:
        with pytest.raises(ollama.ResponseError) as err:
            c.chat(model="no-such-model", messages=HELLO)
        assert err.value.status_code == 404 and err.value.error == "model 'no-such-model' not found"
        with pytest.raises(ollama.ResponseError) as err:
            c.show(f"{CHAT_MODEL}:7b")  # another tag is another model
        assert err.value.status_code == 404


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/api/chat", {"model": CHAT_MODEL, "messages": HELLO, "think": True}, "does not support thinking"),
        (
            "/api/chat",
            {"model": CHAT_MODEL, "messages": [{**HELLO[0], "images": ["aGk="]}]},
            "does not support images",
        ),
        (
            "/api/generate",
            {"model": CHAT_MODEL, "prompt": "x", "images": ["aGk="]},
            "does not support images",
        ),
        (
            "/api/chat",
            {"model": CHAT_MODEL, "messages": HELLO, "options": {"num_ctx": 10_000_000}},
            "num_ctx",
        ),
        ("/api/chat", {"model": CHAT_MODEL, "messages": HELLO, "options": {"mirostat": 2}}, "mirostat"),
        ("/api/generate", {"model": CHAT_MODEL, "prompt": "x", "context": [1, 2, 3]}, "context"),
        ("/api/chat", {"model": CHAT_MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ("/api/chat", {"model": CHAT_MODEL, "messages": HELLO, "format": "yaml"}, "format"),
        ("/api/chat", {"model": EMBED_MODEL, "messages": HELLO}, "embeddings"),
        ("/api/embed", {"model": CHAT_MODEL, "input": "x"}, "chat"),
        ("/api/embed", {"model": EMBED_MODEL, "input": []}, "input"),
        ("/api/embed", {"model": EMBED_MODEL, "input": ""}, "input"),
        ("/api/show", {}, "model"),
        ("/api/pull", {"model": "llama3"}, "pull"),
        ("/api/push", {"model": "llama3"}, "push"),
        ("/api/create", {"model": "x", "from": "llama3"}, "create"),
        ("/api/copy", {"source": CHAT_MODEL, "destination": "x"}, "copy"),
    ],
)
def test_bad_inputs_are_400_in_ollamas_body(
    gateway: GatewayProcess, path: str, body: Any, words: str
) -> None:
    answer = post(gateway, path, body)
    assert answer.status_code == 400, answer.text
    assert set(answer.json()) == {"error"} and words in answer.json()["error"]


def test_malformed_body_is_400(gateway: GatewayProcess) -> None:
    answer = httpx.post(f"{gateway.url}/api/chat", content=b"{not json", timeout=30)
    assert answer.status_code == 400 and "error" in answer.json()
    answer = httpx.post(f"{gateway.url}/api/generate", content=b"[1]", timeout=30)
    assert answer.status_code == 400 and isinstance(answer.json()["error"], str)
