"""`POST /v1/chat/completions`."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from protocol.chat import (
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatDelta,
)
from protocol.common import Usage
from protocol.generation import Delta, GenerateRequest, ToolCallDelta
from protocol.templates import TextTemplate, text_marker
from protocol.tools import ChoiceLogprobs, FunctionCallChunk, FunctionCallOut, ToolCallChunk, ToolCallOut
from server.fanout import merge
from server.requests import CLIENT_CLOSED_REQUEST, Tally, collect, new_id, resolve_model, sample_seed
from server.streaming import sse_response

log = logging.getLogger(__name__)

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    model = resolve_model(request, "chat.completions", body, "generate")
    completion_id, created = new_id("chatcmpl"), int(time.time())
    if body.user:
        log.debug("%s for user %r", completion_id, body.user)
    messages, tools = body.to_engine_messages(), body.tools_spec()
    sequences = []
    for i in range(body.n):
        sampling = body.to_sampling_params()
        sampling.seed = sample_seed(sampling.seed, i)
        sequences.append(
            model.generate(GenerateRequest(f"{completion_id}-{i}", sampling, messages=messages, tools=tools))
        )
    deltas = merge(sequences)
    if body.stream:
        return await sse_response(_chunks(body, completion_id, created, deltas), request)
    tally = await collect(request, deltas)
    if tally is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    completion = ChatCompletion(
        id=completion_id,
        created=created,
        model=body.model,
        choices=[_choice(body, tally, i) for i in range(body.n)],
        usage=Usage.of(*tally.usage_counts(body.n)),
    )
    return Response(completion.to_json(), media_type="application/json")


def _choice(body: ChatCompletionRequest, tally: Tally, i: int) -> ChatCompletionChoice:
    calls = [
        ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments="".join(c.arguments)))
        for c in tally.tool_calls(i)
    ]
    content: str | None = tally.text(i)
    if calls and not (content or "").strip():
        content = None  # OpenAI sends null content next to tool calls
    return ChatCompletionChoice(
        index=i,
        message=ChatCompletionMessage(content=content, tool_calls=calls or None),
        logprobs=ChoiceLogprobs.of(tally.logprobs.get(i, [])) if body.logprobs else None,
        finish_reason=tally.finish.get(i),
    )


def _call_chunks(pieces: list[ToolCallDelta]) -> list[ToolCallChunk]:
    """The first piece of a call names it; every piece carries `index` (clients key on it)."""
    return [
        ToolCallChunk(
            index=p.index,
            id=p.id,
            type="function" if p.id is not None else None,
            function=FunctionCallChunk(name=p.name, arguments=p.arguments),
        )
        for p in pieces
    ]


async def _chunks(
    body: ChatCompletionRequest,
    completion_id: str,
    created: int,
    deltas: AsyncIterator[tuple[int, Delta]],
) -> AsyncIterator[str]:
    tally = Tally()
    marker = text_marker()
    templates: dict[int, TextTemplate] = {}

    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> str:
        return ChatCompletionChunk(
            id=completion_id, created=created, model=body.model, choices=choices, usage=usage
        ).to_json()

    def text_chunk(index: int, text: str) -> str:
        """The per-token chunk, from a template made of the same model (see protocol/templates)."""
        if index not in templates:
            model = ChatCompletionChunk(
                id=completion_id,
                created=created,
                model=body.model,
                choices=[ChatChunkChoice(index=index, delta=ChatDelta(content=marker))],
            )
            templates[index] = TextTemplate(model, marker)
        return templates[index].render(text)

    async for index, delta in deltas:
        if index not in tally.texts:  # first delta of this choice: announce the role first
            yield chunk([ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))])
        tally.add(index, delta)
        content = delta.text or None
        calls = _call_chunks(delta.tool_calls) if delta.tool_calls else None
        logprobs = ChoiceLogprobs.of(delta.logprobs) if body.logprobs and delta.logprobs else None
        if content is not None and delta.finish_reason is None and not calls and logprobs is None:
            yield text_chunk(index, content)
        elif content is not None or calls or logprobs or delta.finish_reason is not None:
            yield chunk(
                [
                    ChatChunkChoice(
                        index=index,
                        delta=ChatDelta(content=content, tool_calls=calls),
                        logprobs=logprobs,
                        finish_reason=delta.finish_reason,
                    )
                ]
            )
    if body.include_usage:
        yield chunk([], Usage.of(*tally.usage_counts(body.n)))
