"""The serving layer (server/serving/) on its own: a FastAPI app with the gateway's routes and
state, over a fake router in this process. No Ray, no model, no gateway process: these run in
well under a second and pin what every endpoint inherits from the base (fan-out order, usage,
stream framing, the 499 on disconnect, admission and deadlines for `/tokenize`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import Field

from raygate.protocol.base import RequestModel, ResponseModel
from raygate.protocol.common import Usage
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import ContextLengthExceededError, ModelNotFoundError
from raygate.protocol.generation import (
    Delta,
    GenerateRequest,
    SamplingParams,
    TokenizeRequest,
    TokenizeResult,
)
from raygate.protocol.model_limits import ModelLimits
from raygate.protocol.sampling_defaults import SamplingDefaults
from raygate.server.access.auth import KeyStore
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.routes import chat, completions, tokenize
from raygate.server.serving.admission import Admission
from raygate.server.serving.base import ChunkedServing
from raygate.server.serving.collect import collect
from raygate.server.serving.tally import Tally
from raygate.server.settings import Settings
from raygate.server.transport.errors import install_error_handlers
from raygate.server.transport.lifecycle import Lifecycle
from raygate.server.transport.middleware import GatewayMiddleware
from raygate.server.transport.unknown_fields import UnknownFieldLog

MODEL = "fake"


class FakeRouter:
    """`ModelRouter`'s interface: each sequence answers `<request id>` word by word."""

    def __init__(self, limits: ModelLimits | None = None, fail: Exception | None = None) -> None:
        self.config = ModelConfig(name=MODEL, backend="synthetic", limits=limits or ModelLimits())
        self.fail = fail
        self.requests: list[GenerateRequest] = []
        self.closed = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        try:
            words = ["a", "b"]
            for i, word in enumerate(words, 1):
                last = i == len(words)
                yield Delta(
                    word, completion_tokens=i, prompt_tokens=3, finish_reason="stop" if last else None
                )
        finally:
            self.closed += 1

    def sampling_defaults(self) -> SamplingDefaults:
        return self.config.defaults  # no generation config: the deployment's own

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return TokenizeResult(tokens=[1, 2], token_strs=["x", "y"], max_model_len=64)

    async def detokenize(self, tokens: list[int]) -> str:
        return "xy"


class FakeCluster:
    def __init__(self, router: FakeRouter) -> None:
        self.router = router

    def get(self, model_id: str) -> FakeRouter:
        if model_id != MODEL:
            raise ModelNotFoundError.for_model(model_id)
        return self.router

    def adapter(self, model_id: str) -> None:
        """The model has no LoRA adapters."""


# A new endpoint on the base: the body, the engine requests, a chunk, a final body. That is all.
class ShoutBody(RequestModel):
    model: str
    prompt: str
    n: int = Field(1, ge=1)
    stream: bool = False


class ShoutResponse(ResponseModel):
    id: str
    texts: list[str]
    usage: Usage


class ShoutServing(ChunkedServing[ShoutBody]):
    endpoint: ClassVar[str] = "shout"
    id_prefix: ClassVar[str] = "shout"

    def __init__(self, body: ShoutBody, request: Request) -> None:
        super().__init__(body, request, stream=body.stream, samples_per_prompt=body.n, include_usage=True)

    def sequences(self) -> list[GenerateRequest]:
        return [
            GenerateRequest(self.sequence_id(i), SamplingParams(), prompt=self.body.prompt)
            for i in range(self.body.n)
        ]

    def delta_chunk(self, index: int, delta: Delta, first: bool) -> str | None:
        return json.dumps({"index": index, "text": delta.text.upper(), "first": first})

    def usage_chunk(self, usage: Usage) -> str:
        return usage.to_json()

    def final_body(self, tally: Tally, choices: int) -> ShoutResponse:
        texts = [tally.text(i).upper() for i in range(choices)]
        return ShoutResponse(id=self.id, texts=texts, usage=self.usage(tally))


shout = APIRouter()


@shout.post("/shout", response_model=None)
async def create_shout(body: ShoutBody, request: Request) -> Response:
    return await ShoutServing(body, request).respond()


def build_app(router: FakeRouter, settings: Settings | None = None) -> FastAPI:
    """What `raygate.server.app.build_app` builds, minus Ray: the state, the error table, the middleware
    (which gives each request its context and releases its admission ticket at the end)."""
    settings = settings or Settings()
    app = FastAPI()
    app.state.settings = settings
    app.state.unknown_fields = UnknownFieldLog()
    app.state.metrics = metrics = GatewayMetrics()
    app.state.admission = Admission()
    app.state.cluster = FakeCluster(router)
    install_error_handlers(app)
    for module_router in (chat.router, completions.router, tokenize.router, shout):
        app.include_router(module_router)
    app.add_middleware(
        GatewayMiddleware,
        keys=KeyStore([]),
        metrics=metrics,
        lifecycle=Lifecycle(drain_timeout_s=settings.drain_timeout_s),
        max_body_bytes=settings.max_body_bytes,
    )
    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def sse_payloads(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


async def test_chat_collects_every_sample_in_order() -> None:
    router = FakeRouter()
    async with client(build_app(router)) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2, "seed": 7},
            headers={"X-Request-Id": "req-1"},
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["message"]["content"] for c in body["choices"]] == ["ab", "ab"]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    ids = sorted(r.request_id for r in router.requests)
    assert ids == [f"req-1/{body['id']}-0", f"req-1/{body['id']}-1"]  # the handle prefixes the HTTP id
    assert sorted(r.sampling.seed for r in router.requests) == [7, 8]


async def test_chat_stream_announces_the_role_once_per_choice_and_ends_with_usage() -> None:
    async with client(build_app(FakeRouter())) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert r.status_code == 200
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:3]] == ["a", "b"]
    assert chunks[2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 5


async def test_completions_number_choices_prompt_major_and_echo_once() -> None:
    router = FakeRouter()
    async with client(build_app(router)) as http:
        body = {"model": MODEL, "prompt": ["p", "q"], "n": 2, "echo": True, "max_tokens": 2}
        r = await http.post("/v1/completions", json=body)
        s = await http.post("/v1/completions", json={**body, "stream": True})
    assert [c["text"] for c in r.json()["choices"]] == ["pab", "pab", "qab", "qab"]
    assert r.json()["usage"]["prompt_tokens"] == 6  # once per prompt, not per sample
    streamed: dict[int, str] = {}
    for payload in sse_payloads(s.text)[:-1]:
        for choice in json.loads(payload)["choices"]:
            streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert streamed == {0: "pab", 1: "pab", 2: "qab", 3: "qab"}


async def test_a_new_endpoint_gets_fan_out_streaming_and_usage_from_the_base() -> None:
    async with client(build_app(FakeRouter())) as http:
        r = await http.post("/shout", json={"model": MODEL, "prompt": "x", "n": 2})
        s = await http.post("/shout", json={"model": MODEL, "prompt": "x", "stream": True})
        missing = await http.post("/shout", json={"model": "nope", "prompt": "x"})
    assert r.json()["texts"] == ["AB", "AB"] and r.json()["id"].startswith("shout-")
    assert sse_payloads(s.text) == [
        '{"index": 0, "text": "A", "first": true}',
        '{"index": 0, "text": "B", "first": false}',
        Usage.of(3, 2).to_json(),
        "[DONE]",
    ]
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


async def test_an_engine_error_before_the_first_chunk_keeps_its_http_status() -> None:
    error = ContextLengthExceededError("too long", param="messages")
    async with client(build_app(FakeRouter(fail=error))) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


async def test_tokenize_waits_for_a_running_slot_under_the_deadline() -> None:
    """/tokenize used to call the router directly: past `max_running` it ran anyway, unbounded."""
    router = FakeRouter(ModelLimits(max_running=1, max_waiting=4))
    app = build_app(router, Settings(request_timeout_s=0.2))
    held = app.state.admission.gate(MODEL, router.config.limits).enter()  # the one running slot
    async with client(app) as http:
        r = await http.post("/tokenize", json={"model": MODEL, "prompt": "x"})
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        d = await http.post("/detokenize", json={"model": MODEL, "tokens": [1]})
        assert d.status_code == 504
        held.release()
        r = await http.post("/tokenize", json={"model": MODEL, "prompt": "x", "return_token_strs": True})
        d = await http.post("/detokenize", json={"model": MODEL, "tokens": [1, 2]})
    assert r.status_code == 200 and r.json() == {
        "count": 2,
        "max_model_len": 64,
        "tokens": [1, 2],
        "token_strs": ["x", "y"],
    }
    assert d.json() == {"prompt": "xy"}
    assert app.state.admission.gates[MODEL].running == 0


async def test_collect_gives_none_and_closes_the_streams_when_the_client_leaves() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[tuple[int, Delta]]:
        try:
            while True:
                await asyncio.sleep(0.01)
                yield 0, Delta("x", completion_tokens=1, prompt_tokens=1)
        finally:
            closed.set()

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    assert await collect(request, endless()) is None
    assert closed.is_set()


@pytest.mark.parametrize(("n", "expected"), [(1, (15, 6, None)), (3, (5, 6, None))])
def test_tally_counts_each_prompt_once(n: int, expected: tuple[int, int, int | None]) -> None:
    tally = Tally()
    for index in range(3):
        tally.add(index, Delta("t", completion_tokens=2, prompt_tokens=5))
    assert tally.usage_counts(n) == expected


@pytest.mark.parametrize(("n", "expected"), [(1, (15, 6, 12)), (3, (5, 6, 4))])
def test_tally_counts_cached_tokens_once_per_prompt(n: int, expected: tuple[int, int, int]) -> None:
    tally = Tally()
    for index in range(3):
        tally.add(index, Delta("t", completion_tokens=2, prompt_tokens=5, cached_tokens=4))
    assert tally.usage_counts(n) == expected
    usage = Usage.of(*expected)
    assert json.loads(usage.to_json())["prompt_tokens_details"] == {"cached_tokens": expected[2]}
    assert "prompt_tokens_details" not in json.loads(Usage.of(5, 2).to_json())


# ---- the sequence cap (issue #12: fan-out amplification) ----------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": ["p"] * 5, "n": 2}, "prompt"),
        ("/v1/completions", {"prompt": "p", "n": 9}, "n"),
        ("/v1/completions", {"prompt": [[1, 2]] * 3, "n": 3}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 9}, "n"),
        ("/shout", {"prompt": "x", "n": 9}, "n"),  # a new endpoint gets it from the base
    ],
    ids=["prompts-x-n", "n-alone", "token-prompts", "chat", "new-endpoint"],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_more_sequences_than_the_cap_is_400_naming_the_field(
    path: str, body: dict[str, Any], param: str, stream: bool
) -> None:
    router = FakeRouter()
    async with client(build_app(router, Settings(max_sequences=8))) as http:
        r = await http.post(path, json={"model": MODEL, "stream": stream, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert "at most 8" in error["message"]
    assert router.requests == []  # refused before any engine request started


async def test_exactly_the_cap_is_served() -> None:
    router = FakeRouter()
    async with client(build_app(router, Settings(max_sequences=8))) as http:
        r = await http.post("/v1/completions", json={"model": MODEL, "prompt": ["p"] * 4, "n": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 8


async def test_the_cap_comes_after_an_unknown_model() -> None:
    async with client(build_app(FakeRouter(), Settings(max_sequences=1))) as http:
        r = await http.post("/v1/completions", json={"model": "nope", "prompt": "p", "n": 2})
    assert r.status_code == 404
