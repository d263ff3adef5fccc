"""Ollama's `/api/chat`, `/api/generate`, `/api/embed` and `/api/embeddings` on the serving layer.

Each is an OpenAI endpoint's serving class with Ollama's rendering: the request is translated
into the OpenAI body (protocol/ollama.py) and runs exactly the path of `/v1/chat/completions`,
`/v1/completions` or `/v1/embeddings` (resolution, admission, the model's defaults, fan-out,
deadlines, metrics, disconnects). Only the answer differs: newline-delimited JSON, one line per
delta and a last line with `done: true`, `done_reason` and the timings, or that last line alone
as the whole body when `stream` is false.

The timings are measured here, in nanoseconds: `load_duration` is the wait for an admission slot
(a model is loaded before it takes requests, or while a request waits at zero replicas),
`prompt_eval_duration` the rest of the time to the first token, `eval_duration` from the first
token to the last, `total_duration` from arrival to the end; the counts are the engine's own.

A reasoning model's thinking (the engine splits it from the answer, `Delta.reasoning`) goes out
as Ollama's `thinking` beside the answer: `message.thinking` on `/api/chat`, `thinking` on
`/api/generate`, piece by piece when streamed, whole in the non-streamed body.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from fastapi import Request
from fastapi.responses import Response

from raygate.backends.streams import closing
from raygate.protocol.base import ResponseModel
from raygate.protocol.config import Task
from raygate.protocol.embeddings import EmbeddingRequest
from raygate.protocol.generation import Delta, TokenLogprob
from raygate.protocol.ollama import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ModelRequest,
    OllamaError,
    openai_body,
)
from raygate.protocol.ollama_response import (
    CallFunction,
    CallOut,
    ChatChunk,
    EmbeddingsResponse,
    EmbedResponse,
    GenerateChunk,
    LogprobOut,
    MessageOut,
    Timings,
)
from raygate.protocol.templates import TextTemplate, text_marker
from raygate.server.context import request_context
from raygate.server.serving.base import GenerationServing, Serving, json_response
from raygate.server.serving.chat import ChatServing
from raygate.server.serving.completions import CompletionServing
from raygate.server.serving.embeddings import EmbeddingServing
from raygate.server.serving.handle import ModelHandle
from raygate.server.serving.ollama_models import model_id, timestamp
from raygate.server.serving.streaming import Payload, SseDialect, ndjson_line, ndjson_response
from raygate.server.serving.tally import CallSoFar, Tally

Shape = Literal["chat", "generate"]
NS = 1_000_000_000

# A failure after the first line travels as Ollama's clients read it: a line holding `error`.
OLLAMA_NDJSON = SseDialect(error=lambda exc: json.dumps({"error": exc.message}), done=b"", frame=ndjson_line)


def _ns(seconds: float) -> int:
    return max(0, int(seconds * NS))


def _done_reason(tally: Tally) -> str:
    return "length" if tally.finish.get(0) == "length" else "stop"


def _calls(calls: list[CallSoFar]) -> list[CallOut]:
    """Ollama's calls carry `arguments` as an object. A forced call is grammar-constrained to its
    schema; one cut off by `num_predict` (`done_reason: length`) has none: `{}`."""
    out = []
    for call in calls:
        text = "".join(call.arguments)
        try:
            value = json.loads(text) if text.strip() else {}
        except ValueError:
            value = {}
        arguments = value if isinstance(value, dict) else {}
        out.append(CallOut(id=call.id, function=CallFunction(name=call.name, arguments=arguments)))
    return out


class OllamaRendering(GenerationServing[Any]):
    """Ollama's NDJSON over a generating endpoint: a mixin placed before the OpenAI serving class
    (`class X(OllamaRendering, ChatServing)`), whose `sequences` it keeps."""

    shape: ClassVar[Shape]
    # Whether the prompt goes through the chat template (where thinking is switched); not `raw`.
    templated: ClassVar[bool] = True
    ollama: ChatRequest | GenerateRequest

    def _ollama(self, ollama: ChatRequest | GenerateRequest) -> None:
        self.ollama = ollama
        self.created_at = timestamp(time.time())
        self._model: ModelHandle | None = None
        self._first_at: float | None = None
        self._last_at: float | None = None
        self._template: TextTemplate | None = None
        self._marker = text_marker()

    # --- the request ---------------------------------------------------------------------------

    def resolve(self) -> ModelHandle:
        self.request.app.state.unknown_fields.note(f"ollama.{self.shape}", self.ollama)
        model = super().resolve()
        name = self.ollama.model
        if self.ollama.thinks():
            if model.config.reasoning is None:
                raise OllamaError(f'"{name}" does not support thinking', param="think")
            if not self.templated:
                raise OllamaError(
                    "`think` needs the model's chat template: not with `raw` or `suffix`", param="think"
                )
        images = self.ollama.images() if isinstance(self.ollama, ChatRequest) else bool(self.ollama.images)
        if images and model.config.vision is None:
            raise OllamaError(f'"{name}" does not support images', param="images")
        if images and not self.templated:
            raise OllamaError(
                "`images` need the model's chat template: not with `raw` or `suffix`", param="images"
            )
        wanted, context = self.ollama.num_ctx, model.context_length
        if wanted is not None and context is not None and wanted > context:
            raise OllamaError(
                f'`options.num_ctx` ({wanted}) is above the context of "{name}" ({context} tokens)',
                param="options.num_ctx",
            )
        self._model = model
        return model

    def observe(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[tuple[int, Delta]]:
        return self._timed(deltas)

    async def _timed(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[tuple[int, Delta]]:
        loop = asyncio.get_running_loop()
        async with closing(deltas):  # closing this closes the merged engine streams
            async for item in deltas:
                self._last_at = loop.time()
                if self._first_at is None:
                    self._first_at = self._last_at
                yield item

    async def streamed(self, payloads: AsyncIterator[Payload]) -> Response:
        return await ndjson_response(payloads, OLLAMA_NDJSON)

    # --- the answer ----------------------------------------------------------------------------

    def _timings(self, tally: Tally) -> Timings:
        started = request_context(self.request).started
        end = asyncio.get_running_loop().time()
        load = self._model.queued_s if self._model else 0.0
        first = self._first_at if self._first_at is not None else end
        last = self._last_at if self._last_at is not None else end
        return Timings(
            total_duration=_ns(end - started),
            load_duration=_ns(load),
            prompt_eval_count=tally.prompt_tokens.get(0, 0),
            prompt_eval_duration=_ns(first - started - load),
            eval_count=tally.completion_tokens.get(0, 0),
            eval_duration=_ns(last - first),
        )

    def _ollama_logprobs(self, entries: list[TokenLogprob] | None) -> list[LogprobOut] | None:
        if not self.ollama.logprobs:
            return None
        return [LogprobOut.of(e) for e in entries or ()]

    def _ollama_chunk(
        self,
        text: str,
        *,
        done: bool,
        thinking: str | None = None,
        calls: list[CallOut] | None = None,
        reason: str | None = None,
        timings: Timings | None = None,
        logprobs: list[LogprobOut] | None = None,
    ) -> ResponseModel:
        times = timings.model_dump() if timings is not None else {}
        created = timestamp(time.time()) if done else self.created_at
        if self.shape == "chat":
            message = MessageOut(content=text, thinking=thinking or None, tool_calls=calls or None)
            return ChatChunk(
                model=self.ollama.model,
                created_at=created,
                message=message,
                done=done,
                done_reason=reason,
                logprobs=logprobs,
                **times,
            )
        return GenerateChunk(
            model=self.ollama.model,
            created_at=created,
            response=text,
            thinking=thinking or None,
            done=done,
            done_reason=reason,
            logprobs=logprobs,
            **times,
        )

    def _piece(self, delta: Delta) -> str:
        logprobs = self._ollama_logprobs(delta.logprobs)
        if delta.reasoning:
            return self._ollama_chunk(
                delta.text, done=False, thinking=delta.reasoning, logprobs=logprobs
            ).to_json()
        if logprobs is None:
            # The per-token path: one template render (protocol/templates.py).
            if self._template is None:
                self._template = TextTemplate(self._ollama_chunk(self._marker, done=False), self._marker)
            return self._template.render(delta.text)
        return self._ollama_chunk(delta.text, done=False, logprobs=logprobs).to_json()

    def _last(self, tally: Tally, text: str) -> ResponseModel:
        calls = _calls(tally.tool_calls(0))
        logprobs = self._ollama_logprobs(tally.logprobs.get(0)) if not self.streaming else None
        return self._ollama_chunk(
            text,
            done=True,
            thinking=tally.thought(0) if not self.streaming else None,
            calls=calls if not self.streaming else None,
            reason=_done_reason(tally),
            timings=self._timings(tally),
            logprobs=logprobs,
        )

    async def stream(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[Payload]:
        """A line per delta with text, the tool calls in one line once complete (Ollama sends a
        call whole), and the `done` line with the reason, counts and timings."""
        tally = Tally()
        async with closing(deltas):  # a stalled reader's stream is closed at a `yield`
            async for index, delta in deltas:
                tally.add(index, delta)
                if delta.text or delta.reasoning or (self.ollama.logprobs and delta.logprobs):
                    yield self._piece(delta)
        calls = _calls(tally.tool_calls(0))
        if calls:
            yield self._ollama_chunk("", done=False, calls=calls).to_json()
        yield self._last(tally, "").to_json()

    def final_body(self, tally: Tally, choices: int) -> ResponseModel:
        text = tally.text(0)
        if tally.tool_calls(0) and not text.strip():
            text = ""  # a model's newline before its call is no answer
        return self._last(tally, text)


class OllamaChatServing(OllamaRendering, ChatServing):  # type: ignore[misc]
    """`POST /api/chat`: chat completions' path, Ollama's lines."""

    endpoint: ClassVar[str] = "chat.completions"
    shape: ClassVar[Shape] = "chat"

    def __init__(self, ollama: ChatRequest, request: Request, resolved: str) -> None:
        ChatServing.__init__(self, ollama.to_openai(resolved), request)
        self._ollama(ollama)


class OllamaGenerateChatServing(OllamaRendering, ChatServing):  # type: ignore[misc]
    """`POST /api/generate` through the chat template: one user turn (after `system`)."""

    endpoint: ClassVar[str] = "chat.completions"
    shape: ClassVar[Shape] = "generate"

    def __init__(self, ollama: GenerateRequest, request: Request, body: Any) -> None:
        ChatServing.__init__(self, body, request)
        self._ollama(ollama)


class OllamaGenerateRawServing(OllamaRendering, CompletionServing):  # type: ignore[misc]
    """`POST /api/generate` with `raw` or `suffix`: text completions' path (fill-in-the-middle
    for a suffix)."""

    endpoint: ClassVar[str] = "completions"
    shape: ClassVar[Shape] = "generate"
    templated: ClassVar[bool] = False

    def __init__(self, ollama: GenerateRequest, request: Request, body: Any) -> None:
        CompletionServing.__init__(self, body, request)
        self._ollama(ollama)


class OllamaLoadServing(Serving[ModelRequest]):
    """A chat without messages or a generate without a prompt: Ollama loads the model and says
    so (`done_reason: load`). Here every listed model is loaded already (or starts on the first
    request when scaled to zero): the model is resolved and admitted, nothing is generated."""

    task: ClassVar[Task | None] = "generate"

    def __init__(self, body: ModelRequest, request: Request, shape: Shape, name: str) -> None:
        super().__init__(body, request)
        self.endpoint = f"ollama.{shape}"  # type: ignore[misc]
        self.shape, self.name = shape, name

    async def respond(self) -> Response:
        self.resolve()
        now = timestamp(time.time())
        if self.shape == "chat":
            body: ResponseModel = ChatChunk(
                model=self.name, created_at=now, message=MessageOut(content=""), done=True, done_reason="load"
            )
        else:
            body = GenerateChunk(model=self.name, created_at=now, response="", done=True, done_reason="load")
        return json_response(body)


def generate_serving(body: GenerateRequest, request: Request) -> Serving[Any]:
    """The serving object of one `/api/generate` body."""
    resolved = model_id(request, body.model)
    refused = body.refused()
    if refused is not None:
        raise OllamaError(f"`{refused}` is not supported by this server", param=refused)
    if body.loads_only():
        return OllamaLoadServing(ModelRequest(model=resolved), request, "generate", body.model)
    openai = body.to_openai(resolved)
    if body.completes():
        return OllamaGenerateRawServing(body, request, openai)
    return OllamaGenerateChatServing(body, request, openai)


def chat_serving(body: ChatRequest, request: Request) -> Serving[Any]:
    """The serving object of one `/api/chat` body."""
    resolved = model_id(request, body.model)
    if not body.messages:
        return OllamaLoadServing(ModelRequest(model=resolved), request, "chat", body.model)
    return OllamaChatServing(body, request, resolved)


class OllamaEmbedServing(EmbeddingServing):
    """`POST /api/embed`: embeddings' path, Ollama's body (unit vectors, as Ollama's are)."""

    endpoint: ClassVar[str] = "embeddings"

    def __init__(self, ollama: EmbedRequest, request: Request) -> None:
        resolved = model_id(request, ollama.model)
        fields = {"model": resolved, "input": ollama.inputs(), "dimensions": ollama.dimensions}
        super().__init__(openai_body(EmbeddingRequest, fields), request)
        self.ollama = ollama

    async def respond(self) -> Response:
        loop = asyncio.get_running_loop()
        result = await self.embedded()
        took = loop.time() - request_context(self.request).started
        return json_response(
            EmbedResponse(
                model=self.ollama.model,
                embeddings=result.embeddings,
                total_duration=_ns(took),
                load_duration=0,
                prompt_eval_count=result.prompt_tokens,
            )
        )


class OllamaEmbeddingsServing(EmbeddingServing):
    """`POST /api/embeddings`, the older form: one prompt, one `embedding` (empty for no prompt,
    as in Ollama)."""

    endpoint: ClassVar[str] = "embeddings"

    def __init__(self, ollama: EmbeddingsRequest, request: Request) -> None:
        resolved = model_id(request, ollama.model)
        super().__init__(
            openai_body(EmbeddingRequest, {"model": resolved, "input": ollama.prompt or " "}), request
        )
        self.empty = not ollama.prompt

    async def respond(self) -> Response:
        if self.empty:
            self.resolve()
            return json_response(EmbeddingsResponse(embedding=[]))
        result = await self.embedded()
        return json_response(EmbeddingsResponse(embedding=result.embeddings[0]))
