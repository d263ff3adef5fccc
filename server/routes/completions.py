"""`POST /v1/completions` (the legacy text API, still used by many tools and benchmarks)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from protocol.common import Usage
from protocol.completions import Completion, CompletionChoice, CompletionRequest
from protocol.errors import UnsupportedParameterError
from protocol.generation import Delta, GenerateRequest, TokenLogprob
from protocol.templates import TextTemplate, text_marker
from protocol.tools import CompletionLogprobs
from server.fanout import merge
from server.requests import CLIENT_CLOSED_REQUEST, Tally, collect, new_id, resolve_model, sample_seed
from server.streaming import sse_response

log = logging.getLogger(__name__)

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    model = resolve_model(request, "completions", body, "generate")
    completion_id, created = new_id("cmpl"), int(time.time())
    if body.user:
        log.debug("%s for user %r", completion_id, body.user)
    prompts = body.prompts()
    if body.echo and any(not isinstance(p, str) for p in prompts):
        raise UnsupportedParameterError("`echo` works with text prompts only.", param="echo")
    if body.echo and body.suffix is not None:
        raise UnsupportedParameterError("`echo` cannot be combined with `suffix`.", param="suffix")
    sequences = []
    for p, prompt in enumerate(prompts):
        for i in range(body.n):
            sampling = body.to_sampling_params()
            sampling.seed = sample_seed(sampling.seed, i)
            request_id = f"{completion_id}-{p * body.n + i}"
            sequences.append(
                model.generate(GenerateRequest(request_id, sampling, prompt=prompt, suffix=body.suffix))
            )
    echoes = [p if body.echo and isinstance(p, str) else "" for p in prompts]
    deltas = merge(sequences)
    if body.stream:
        return await sse_response(_chunks(body, completion_id, created, echoes, deltas), request)
    tally = await collect(request, deltas)
    if tally is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    completion = Completion(
        id=completion_id,
        created=created,
        model=body.model,
        choices=[
            CompletionChoice(
                index=i,
                text=echoes[i // body.n] + tally.text(i),
                logprobs=_logprobs(body, tally.prompt_logprobs.get(i, []) + tally.logprobs.get(i, []), 0),
                finish_reason=tally.finish.get(i),
            )
            for i in range(len(sequences))
        ],
        usage=Usage.of(*tally.usage_counts(body.n)),
    )
    return Response(completion.to_json(), media_type="application/json")


def _logprobs(body: CompletionRequest, entries: list[TokenLogprob], start: int) -> CompletionLogprobs | None:
    """`text_offset` counts characters into the choice's `text` (the echoed prompt included)."""
    return CompletionLogprobs.of(entries, start) if body.logprobs is not None else None


async def _chunks(
    body: CompletionRequest,
    completion_id: str,
    created: int,
    echoes: list[str],
    deltas: AsyncIterator[tuple[int, Delta]],
) -> AsyncIterator[str]:
    tally = Tally()
    offsets: dict[int, int] = {}
    marker = text_marker()
    templates: dict[int, TextTemplate] = {}

    def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        return Completion(
            id=completion_id, created=created, model=body.model, choices=choices, usage=usage
        ).to_json()

    def text_chunk(index: int, text: str) -> str:
        """The per-token chunk, from a template made of the same model (see protocol/templates)."""
        if index not in templates:
            choice = CompletionChoice(index=index, text=marker, finish_reason=None)
            model = Completion(id=completion_id, created=created, model=body.model, choices=[choice])
            templates[index] = TextTemplate(model, marker)
        return templates[index].render(text)

    async for index, delta in deltas:
        echo = echoes[index // body.n] if index not in tally.texts else ""
        tally.add(index, delta)
        entries = (delta.prompt_logprobs or []) + (delta.logprobs or [])
        logprobs = _logprobs(body, entries, offsets.get(index, 0)) if entries else None
        offsets[index] = offsets.get(index, 0) + sum(len(e.token) for e in entries)
        if delta.text and not echo and delta.finish_reason is None and logprobs is None:
            yield text_chunk(index, delta.text)
        elif echo or delta.text or logprobs or delta.finish_reason is not None:
            yield chunk(
                [
                    CompletionChoice(
                        index=index,
                        text=echo + delta.text,
                        logprobs=logprobs,
                        finish_reason=delta.finish_reason,
                    )
                ]
            )
    if body.include_usage:
        yield chunk([], Usage.of(*tally.usage_counts(body.n)))
