"""The chaos run's traffic: a closed loop of clients mixing every API the gateway serves, each request
classified by what its client saw.

Raw HTTP rather than the SDKs: an SDK retries, and turns a stream cut short into an exception that
looks like any other; here every request is sent once, and its end is judged from the bytes. A
request ends in one of four ways:

- `ok`: a complete answer (a JSON body with the API's fields; a stream that reached the API's own
  end: `[DONE]`, `response.completed`, `message_stop`) and no error in it;
- `refused`: an error the client can see: a status with the API's error body, an in-band error
  frame followed by the stream's end, a connection refused by a gateway that is down, or one it
  closed before any answer began (`closed`; see `broken`);
- `silent`: anything else: a stream cut without an error, a body that does not parse, a 200
  without the answer's fields (the losses the run must never see);
- `hung`: no end within the deadline.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

DEADLINE_S = 180.0  # a request still open after this counts as hung (each needs seconds)
# A batch runs behind the interactive clients (its lines start only while none waits for the
# model), so it is given longer: upload, create and poll to a final status within this.
BATCH_DEADLINE_S = 600.0
BATCH_LINES = 3
BATCH_FINAL = ("completed", "failed", "expired", "cancelled")
OK, REFUSED, SILENT, HUNG = "ok", "refused", "silent", "hung"
CLOSED = "closed"  # a refusal's code: the connection closed before any answer (a gateway stopping)


@dataclass(frozen=True)
class Outcome:
    api: str
    kind: str  # OK, REFUSED, SILENT or HUNG
    status: int  # HTTP status; 0 when none arrived
    code: str | None  # the error body's code (or type), when refused
    started: float  # time.monotonic()
    ended: float
    gateway: str
    detail: str = ""


@dataclass
class Models:
    chat: str
    embed: str
    rerank: str


@dataclass
class Traffic:
    """Gateways to spread requests over (the fault schedule swaps one while it restarts) and what
    the clients have done so far."""

    gateways: list[str]
    models: Models
    headers: dict[str, str] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)  # Responses ids answered with store: true
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)  # batch id -> its final object
    paused: set[str] = field(default_factory=set)  # APIs no client sends now (scale-to-zero fault)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, concurrency: int, seed: int) -> None:
        """`concurrency` clients, each sending one request after another until `stop` is set."""
        limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
        async with client_for(self.headers, limits) as client:
            await asyncio.gather(*(self._client(client, random.Random(seed + i)) for i in range(concurrency)))

    async def _client(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        while not self.stop.is_set():
            api, send = rng.choice([(a, s) for a, s in REQUESTS.items() if a not in self.paused])
            gateway = rng.choice(self.gateways)
            started = time.monotonic()
            try:
                kind, status, code, detail = await asyncio.wait_for(
                    send(self, client, gateway, rng), DEADLINES.get(api, DEADLINE_S)
                )
            except TimeoutError:
                kind, status, code, detail = HUNG, 0, None, "no end within the deadline"
            except httpx.TransportError as exc:
                kind, status, code, detail = broken(exc)
            except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                kind, status, code, detail = SILENT, 0, None, repr(exc)[:300]
            self.outcomes.append(Outcome(api, kind, status, code, started, time.monotonic(), gateway, detail))


Result = tuple[str, int, str | None, str]
ANSWERED = "raygate-chaos-answered"  # set in a request's extensions once its status line arrived


async def _answered(response: httpx.Response) -> None:
    response.request.extensions[ANSWERED] = True


def client_for(headers: dict[str, str], limits: httpx.Limits) -> httpx.AsyncClient:
    """The clients' HTTP client: it marks each request whose answer began, for `broken`."""
    return httpx.AsyncClient(
        headers=headers, limits=limits, timeout=DEADLINE_S, event_hooks={"response": [_answered]}
    )


def broken(exc: httpx.TransportError) -> Result:
    """A connection that failed, judged by whether an answer had begun on it. None had: a refused
    connection (a gateway that is down), or a kept-alive one the stopping gateway closed or reset
    as the request went out (HTTP/1.1's race, which no server can close: RFC 9112 section 9.3.1;
    a POST is not retried by itself). The client sees either as an error at once, so both are
    refusals, allowed only while a gateway restarts (report.py). An answer had begun: a body cut
    short, silent."""
    try:
        answered = bool(exc.request.extensions.get(ANSWERED))
    except RuntimeError:  # no request attached: nothing was sent
        answered = False
    if isinstance(exc, httpx.ConnectError):
        return REFUSED, 0, "connect", repr(exc)[:200]
    if not answered:
        return REFUSED, 0, CLOSED, repr(exc)[:200]
    return SILENT, 0, None, repr(exc)[:300]


Send = Callable[[Traffic, httpx.AsyncClient, str, random.Random], Awaitable[Result]]


def _refusal(r: httpx.Response, body: Any) -> Result:
    """A non-200 answer: refused when its body is the API's error, silent otherwise."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return REFUSED, r.status_code, error.get("code") or error.get("type"), error["message"][:200]
    return SILENT, r.status_code, None, f"error without the API's body: {r.text[:200]}"


async def _post_json(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], check: Callable[[Any], bool]
) -> Result:
    r = await client.post(url, json=body)
    data = r.json()
    if r.status_code != 200:
        return _refusal(r, data)
    return (OK, 200, None, "") if check(data) else (SILENT, 200, None, f"incomplete answer: {r.text[:200]}")


# What one stream event means, as an API's `end` function says it.
GO_ON, ERROR, END, ERROR_END = "go-on", "error", "end", "error-end"


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], end: Callable[[str | None, Any], str]
) -> Result:
    """A server-sent event stream read to its end. `end(event, data)` says what each event means
    (GO_ON, ERROR: an error frame, END: the API's last event, ERROR_END: both); OpenAI's
    `data: [DONE]` is passed as the string "[DONE]". Ended after an error frame: refused; ended
    without one: ok; not ended: silent."""
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return _refusal(r, json.loads(r.content))
        event: str | None = None
        error: str | None = None
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                payload = line[6:]
                meaning = end(event, payload if payload == "[DONE]" else json.loads(payload))
                if meaning in (ERROR, ERROR_END):
                    error = payload[:200]
                if meaning in (END, ERROR_END):
                    return (REFUSED, 200, "in-band", error) if error else (OK, 200, None, "")
        return SILENT, 200, None, f"stream ended without its end event (last: {event}; error: {error})"


def _openai_end(event: str | None, data: Any) -> str:
    """Chat and completions: chunks, perhaps an error frame, then `[DONE]`."""
    if data == "[DONE]":
        return END
    return ERROR if "error" in data else GO_ON


def _responses_end(event: str | None, data: Any) -> str:
    """Responses: `error` then `response.failed`, or `response.completed` / `.incomplete`."""
    kind = data.get("type")
    if kind in ("response.completed", "response.incomplete"):
        return END
    return {"response.failed": ERROR_END, "error": ERROR}.get(kind, GO_ON)


def _messages_end(event: str | None, data: Any) -> str:
    """Messages: `message_stop`, or Anthropic's `error` event, after which nothing follows."""
    return {"message_stop": END, "error": ERROR_END}.get(event or "", GO_ON)


async def chat_tools(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    body = {
        "model": t.models.chat,
        "messages": [{"role": "user", "content": f"Weather in Paris? ({rng.random():.3f})"}],
        "tools": [tool],
        "max_tokens": rng.randint(8, 32),
    }
    return await _post_json(c, f"{url}/v1/chat/completions", body, lambda d: d["choices"][0]["finish_reason"])


async def chat_schema_stream(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {
        "model": t.models.chat,
        "messages": [{"role": "user", "content": f"A number please ({rng.random():.3f})"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        "max_tokens": rng.randint(8, 24),
        "stream": True,
    }
    return await _stream(c, f"{url}/v1/chat/completions", body, _openai_end)


async def completion(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    body: dict[str, Any] = {"model": t.models.chat, "prompt": f"Once upon a time {rng.random():.3f}"}
    body["max_tokens"] = rng.randint(4, 32)
    if rng.random() < 0.5:
        return await _stream(c, f"{url}/v1/completions", {**body, "stream": True}, _openai_end)
    return await _post_json(c, f"{url}/v1/completions", body, lambda d: d["choices"][0]["finish_reason"])


async def embeddings(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    body = {"model": t.models.embed, "input": [f"chaos {rng.random():.4f}", "second input"]}
    return await _post_json(c, f"{url}/v1/embeddings", body, lambda d: len(d["data"][1]["embedding"]) > 0)


async def rerank(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    body = {"model": t.models.rerank, "query": "what is ray?", "documents": ["a cluster", "a fish", "light"]}
    return await _post_json(c, f"{url}/v1/rerank", body, lambda d: len(d["results"]) == 3)


async def responses_chain(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    """A stored response, then a streamed follow-up through `previous_response_id`."""
    first = {
        "model": t.models.chat,
        "input": f"Say a word ({rng.random():.3f})",
        "max_output_tokens": 16,
    }  # OpenAI's least
    r = await c.post(f"{url}/v1/responses", json=first)
    data = r.json()
    if r.status_code != 200:
        return _refusal(r, data)
    if data["status"] not in ("completed", "incomplete") or not data["output"]:
        return SILENT, 200, None, f"stored response not complete: {r.text[:200]}"
    t.stored.append(data["id"])
    follow = {
        "model": t.models.chat,
        "input": "And another",
        "previous_response_id": data["id"],
        "max_output_tokens": rng.randint(16, 32),
        "stream": True,
    }
    return await _stream(c, f"{url}/v1/responses", follow, _responses_end)


async def messages(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    body = {
        "model": t.models.chat,
        "max_tokens": rng.randint(8, 32),
        "messages": [{"role": "user", "content": f"Hello ({rng.random():.3f})"}],
        "stream": rng.random() < 0.6,
    }
    if not body["stream"]:
        return await _post_json(c, f"{url}/v1/messages", body, lambda d: d["stop_reason"] is not None)
    return await _stream(c, f"{url}/v1/messages", body, _messages_end)


async def xinference(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    """Xinference's description of a running model, then a chat through its client's path."""
    r = await c.get(f"{url}/v1/models/{t.models.chat}")
    data = r.json()
    if r.status_code != 200:
        return _refusal(r, data)
    if data.get("model_type") != "LLM":
        return SILENT, 200, None, f"not Xinference's model card: {r.text[:200]}"
    body = {"model": t.models.chat, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    return await _post_json(c, f"{url}/v1/chat/completions", body, lambda d: d["choices"][0]["finish_reason"])


def _ollama_refusal(r: httpx.Response, body: Any) -> Result:
    """Ollama's error body is `{"error": "<message>"}` and nothing else: no code to judge a 5xx by,
    so the report judges those by the fault windows alone (`OLLAMA_5XX`)."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        code = OLLAMA_5XX if r.status_code >= 500 else "ollama"
        return REFUSED, r.status_code, code, body["error"][:200]
    return SILENT, r.status_code, None, f"error without Ollama's body: {r.text[:200]}"


OLLAMA_5XX = "ollama-5xx"


async def _ndjson(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Result:
    """Ollama's stream: JSON lines, the last one `done: true`; a failure after the first line is a
    line holding `error`, after which the stream ends."""
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return _ollama_refusal(r, json.loads(r.content))
        async for raw in r.aiter_lines():
            if not raw.strip():
                continue
            data = json.loads(raw)
            if "error" in data:
                return REFUSED, 200, "in-band", str(data["error"])[:200]
            if data.get("done") is True:
                return (OK, 200, None, "") if data.get("done_reason") else (SILENT, 200, None, raw[:200])
        return SILENT, 200, None, "stream ended without its done line or an error line"


async def _ollama_json(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], check: Callable[[Any], bool]
) -> Result:
    r = await client.post(url, json=body)
    data = r.json()
    if r.status_code != 200:
        return _ollama_refusal(r, data)
    return (OK, 200, None, "") if check(data) else (SILENT, 200, None, f"incomplete answer: {r.text[:200]}")


async def ollama_chat(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    """`/api/chat` (streamed by default, as Ollama's clients do) or `/api/generate`."""
    options = {"num_predict": rng.randint(4, 24)}
    if rng.random() < 0.5:
        messages = [{"role": "user", "content": f"Hi ({rng.random():.3f})"}]
        body: dict[str, Any] = {"model": t.models.chat, "messages": messages, "options": options}
        path, field_ = "/api/chat", "message"
    else:
        body = {"model": t.models.chat, "prompt": f"Once upon a time {rng.random():.3f}", "options": options}
        path, field_ = "/api/generate", "response"
    if rng.random() < 0.6:
        return await _ndjson(c, f"{url}{path}", body)
    return await _ollama_json(
        c, f"{url}{path}", {**body, "stream": False}, lambda d: d["done"] is True and field_ in d
    )


async def ollama_embed(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    body = {"model": t.models.embed, "input": [f"chaos {rng.random():.4f}", "second"]}
    return await _ollama_json(c, f"{url}/api/embed", body, lambda d: len(d["embeddings"]) == 2)


async def batch(t: Traffic, c: httpx.AsyncClient, url: str, rng: random.Random) -> Result:
    """Files + Batches: upload a small JSONL of chat lines, create the batch, poll it (through any
    gateway, as a client that outlives one would) to a final status, then check it: every line's
    `custom_id` exactly once across the output and error files, `request_counts` saying the same.
    A line's error (in the error file) counts as a refusal, judged like a request's."""
    tag = f"{rng.getrandbits(32):08x}"
    lines = [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": t.models.chat,
                "messages": [{"role": "user", "content": f"Count to {i}."}],
                "max_tokens": rng.randint(4, 12),
            },
        }
        for i in range(BATCH_LINES)
    ]
    jsonl = "".join(json.dumps(line) + "\n" for line in lines).encode()
    try:
        r = await c.post(f"{url}/v1/files", files={"file": ("chaos.jsonl", jsonl)}, data={"purpose": "batch"})
        if r.status_code != 200:
            return _refusal(r, r.json())
        file_id = r.json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        r = await c.post(f"{url}/v1/batches", json=body)
    except httpx.TransportError as exc:
        return broken(exc)
    if r.status_code != 200:
        return _refusal(r, r.json())
    batch_id = r.json()["id"]
    t.batches[batch_id] = r.json()
    while True:  # bounded by BATCH_DEADLINE_S; a poll the cluster refuses (a fault) is tried again
        await asyncio.sleep(2)
        try:
            r = await c.get(f"{rng.choice(t.gateways)}/v1/batches/{batch_id}")
        except httpx.TransportError:
            continue
        if r.status_code >= 500:
            continue
        if r.status_code != 200:
            return _refusal(r, r.json())
        state = r.json()
        t.batches[batch_id] = state
        if state["status"] in BATCH_FINAL:
            break
    if state["status"] != "completed":
        return REFUSED, 0, f"batch-{state['status']}", json.dumps(state.get("errors"))[:200]
    problems, worst = await batch_problems(c, t.gateways, state, {line["custom_id"] for line in lines})
    if problems:
        return SILENT, 200, None, f"batch {batch_id}: {problems}"[:300]
    return worst


async def _file_content(c: httpx.AsyncClient, gateways: list[str], file_id: str) -> httpx.Response:
    """A file's content as a client would get it while gateways restart: a 5xx or a refused
    connection is tried again through any gateway, for up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            r = await c.get(f"{random.choice(gateways)}/v1/files/{file_id}/content")
            if r.status_code < 500 or time.monotonic() > deadline:
                return r
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(2)


async def batch_problems(
    c: httpx.AsyncClient, gateways: list[str], state: dict[str, Any], custom_ids: set[str]
) -> tuple[str, Result]:
    """What is wrong with a completed batch (empty when nothing), and how its lines ended: ok, or
    the first line's error as a refusal."""
    rows: list[dict[str, Any]] = []
    for key in ("output_file_id", "error_file_id"):
        if state.get(key):
            r = await _file_content(c, gateways, state[key])
            if r.status_code != 200:
                return f"{key} {state[key]} unreadable: {r.status_code} {r.text[:100]}", (SILENT, 0, None, "")
            rows += [json.loads(row) for row in r.text.splitlines() if row.strip()]
    seen = [row["custom_id"] for row in rows]
    counts = state["request_counts"]
    failed = [
        row for row in rows if row.get("error") or (row.get("response") or {}).get("status_code") != 200
    ]
    if sorted(seen) != sorted(custom_ids):
        return f"custom_ids {sorted(seen)} != the file's {sorted(custom_ids)}", (SILENT, 0, None, "")
    if (counts["total"], counts["completed"] + counts["failed"], counts["failed"]) != (
        len(custom_ids),
        len(custom_ids),
        len(failed),
    ):
        return f"request_counts {counts} for {len(custom_ids)} lines, {len(failed)} failed", (
            SILENT,
            0,
            None,
            "",
        )
    if not failed:
        return "", (OK, 200, None, "")
    first = failed[0]
    response = first.get("response") or {}
    error = (response.get("body") or {}).get("error") or first.get("error") or {}
    code = error.get("code") or error.get("type") or "batch-line"
    return "", (REFUSED, int(response.get("status_code") or 0), code, str(error.get("message"))[:200])


REQUESTS: dict[str, Send] = {
    "chat+tools": chat_tools,
    "chat+schema/stream": chat_schema_stream,
    "completions": completion,
    "embeddings": embeddings,
    "rerank": rerank,
    "responses": responses_chain,
    "messages": messages,
    "xinference": xinference,
    "ollama chat/generate": ollama_chat,
    "ollama embed": ollama_embed,
    "batch": batch,
}
DEADLINES = {"batch": BATCH_DEADLINE_S}
