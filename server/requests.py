"""What every generation route does around the engine: find the model, refuse what it cannot
honour, note unknown fields once, and gather a non-streamed answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from backends.cluster.controller_client import ControllerClient
from protocol.base import RequestModel
from protocol.config import Task
from protocol.errors import BadRequestError, UnsupportedParameterError
from protocol.generation import Delta, TokenLogprob
from server.auth import check_model_access
from server.context import request_context
from server.guard import ModelHandle, open_model

log = logging.getLogger(__name__)

# nginx's status for "client closed request": what the access log and metrics record when the
# client left before a non-streamed answer was ready (nobody receives it).
CLIENT_CLOSED_REQUEST = 499

_TASK_ENDPOINTS = {"generate": "chat and text completions", "embed": "embeddings"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class UnknownFieldLog:
    """Logs each unknown request field once per process: useful, and not a log flood."""

    seen: set[str] = field(default_factory=set)

    def note(self, endpoint: str, body: RequestModel) -> None:
        for name in body.model_extra or {}:
            key = f"{endpoint}:{name}"
            if key not in self.seen:
                self.seen.add(key)
                log.warning("ignoring unknown field %r on %s", name, endpoint)


def resolve_model(request: Request, endpoint: str, body: RequestModel, task: Task | None) -> ModelHandle:
    """The model the body names, checked against the API key, and admitted (or refused with 429).
    `task=None`: any model will do (tokenizers)."""
    cluster: ControllerClient = request.app.state.cluster
    request.app.state.unknown_fields.note(endpoint, body)
    router = cluster.get(str(getattr(body, "model")))
    check_model_access(request_context(request).key, router.config.ids)
    if task is not None and router.config.task != task:
        raise BadRequestError(
            f"Model `{router.config.name}` serves {_TASK_ENDPOINTS[router.config.task]}, "
            f"not {_TASK_ENDPOINTS[task]}.",
            param="model",
        )
    unsupported = getattr(body, "unsupported_fields", lambda: [])()
    if unsupported:
        raise UnsupportedParameterError(
            f"`{unsupported[0]}` is not supported by the {router.config.backend} backend yet.",
            param=unsupported[0],
        )
    return open_model(request, router)


def sample_seed(seed: int | None, sample: int) -> int | None:
    """n samples with one seed must still differ from each other, and repeat across calls."""
    return None if seed is None else seed + sample


@dataclass
class CallSoFar:
    """A tool call assembled from its streamed pieces."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class Tally:
    """Per-choice text, tool calls, logprobs, finish reason and token counts, for non-streamed
    bodies and usage."""

    texts: dict[int, list[str]] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    prompt_tokens: dict[int, int] = field(default_factory=dict)
    completion_tokens: dict[int, int] = field(default_factory=dict)
    logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    calls: dict[int, dict[int, CallSoFar]] = field(default_factory=dict)

    def add(self, index: int, delta: Delta) -> None:
        self.texts.setdefault(index, []).append(delta.text)
        self.prompt_tokens[index] = delta.prompt_tokens
        self.completion_tokens[index] = delta.completion_tokens
        if delta.finish_reason is not None:
            self.finish[index] = delta.finish_reason
        if delta.logprobs:
            self.logprobs.setdefault(index, []).extend(delta.logprobs)
        if delta.prompt_logprobs:
            self.prompt_logprobs[index] = delta.prompt_logprobs
        for piece in delta.tool_calls or ():
            call = self.calls.setdefault(index, {}).setdefault(piece.index, CallSoFar())
            call.id = piece.id or call.id
            call.name = piece.name or call.name
            call.arguments.append(piece.arguments)

    def tool_calls(self, index: int) -> list[CallSoFar]:
        return [c for _, c in sorted(self.calls.get(index, {}).items())]

    def text(self, index: int) -> str:
        return "".join(self.texts.get(index, []))

    def usage_counts(self, samples_per_prompt: int) -> tuple[int, int]:
        """Prompt tokens count once per prompt, however many samples were drawn from it."""
        prompt = sum(n for i, n in self.prompt_tokens.items() if i % samples_per_prompt == 0)
        return prompt, sum(self.completion_tokens.values())


async def collect(request: Request, deltas: AsyncIterator[tuple[int, Delta]]) -> Tally | None:
    """A whole non-streamed answer, or None if the client disconnected first.

    Reading stops when the client goes: the read is cancelled, which closes the engine streams
    (and their Ray generators), so the engines abort instead of decoding to `max_tokens` for
    nobody. A streamed answer gets the same from sse-starlette's disconnect watch.
    """
    tally = Tally()

    async def read() -> Tally:
        async for index, delta in deltas:
            tally.add(index, delta)
        return tally

    reading = asyncio.create_task(read())
    watching = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait((reading, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not reading.done():
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
    if reading.cancelled():
        log.info("client disconnected before the answer was complete; its engine requests were aborted")
        return None
    return reading.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
