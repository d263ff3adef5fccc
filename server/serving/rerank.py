"""`RerankServing` and `ScoreServing`: `POST /v1/rerank` (and `/rerank`, `/v2/rerank`) and
`POST /v1/score` on the serving base.

Both reduce to one list of (query, document) pairs scored by the model, in one engine call:

* a cross-encoder (`task: rerank`) returns one logit per pair (`ModelHandle.rank`); the score is
  its sigmoid unless the request sets `use_activation: false` (vLLM's and sentence-transformers'
  convention, so scores are in (0, 1) like Cohere's);
* an embedding model (`task: embed`) embeds each distinct text once and scores a pair by the
  cosine similarity of the two vectors, in [-1, 1].

A pair longer than the model's context is refused with a 400 naming the field (`documents`,
`text_2`), never truncated: a truncated document would be ranked on text the client cannot see.
"""

from __future__ import annotations

import math
from typing import ClassVar

from fastapi.responses import Response

from raygate.protocol.config import Task
from raygate.protocol.embeddings import unit_vector
from raygate.protocol.errors import BadRequestError, ContextLengthExceededError
from raygate.protocol.generation import EmbedRequest, RankRequest
from raygate.protocol.rerank import (
    RerankBilledUnits,
    RerankedDocument,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    ScoreUsage,
)
from raygate.server.serving.base import Serving, json_response
from raygate.server.serving.handle import ModelHandle
from raygate.server.serving.ids import new_id

# Cohere bills one search unit per 100 documents; `meta.billed_units` reports it the same way.
DOCUMENTS_PER_SEARCH_UNIT = 100


def sigmoid(x: float) -> float:
    """The logistic function, without overflow for large negative logits."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(unit_vector(a), unit_vector(b), strict=True))


async def score_pairs(
    model: ModelHandle,
    request_id: str,
    pairs: list[tuple[str, str]],
    *,
    param: str,
    use_activation: bool | None,
) -> tuple[list[float], int]:
    """One score per pair, in pair order, and the prompt tokens the model read for them."""
    limit = model.config.limits.max_documents
    if len(pairs) > limit:
        raise BadRequestError(
            f"{len(pairs)} {param} sent; model `{model.config.name}` takes at most {limit} per request.",
            param=param,
        )
    if model.config.task == "rerank":
        ranked = await model.rank(RankRequest(request_id, pairs, param))
        scores = ranked.scores if use_activation is False else [sigmoid(s) for s in ranked.scores]
        return scores, ranked.prompt_tokens
    texts = list(dict.fromkeys(t for pair in pairs for t in pair))  # each distinct text once
    try:
        embedded = await model.embed(EmbedRequest(request_id, texts))
    except ContextLengthExceededError as exc:
        raise ContextLengthExceededError(
            f"The query or a document is too long for model `{model.config.name}`: {exc.message}",
            param=param,
        ) from None
    vectors = dict(zip(texts, embedded.embeddings, strict=True))
    return [cosine(vectors[q], vectors[d]) for q, d in pairs], embedded.prompt_tokens


class RerankServing(Serving[RerankRequest]):
    """Jina/Cohere rerank: every document scored against the query, best first, cut to `top_n`."""

    endpoint: ClassVar[str] = "rerank"
    task: ClassVar[Task | tuple[Task, ...] | None] = ("rerank", "embed")

    async def respond(self) -> Response:
        body = self.body
        model = self.resolve()
        docs = body.texts()
        rid = new_id("rerank")
        scores, tokens = await score_pairs(
            model, rid, [(body.query, d) for d in docs], param="documents", use_activation=body.use_activation
        )
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[: body.top_n]
        response = RerankResponse(
            id=rid,
            model=body.model,
            results=[
                RerankResult(
                    index=i,
                    relevance_score=scores[i],
                    document=RerankedDocument(text=docs[i]) if body.return_documents else None,
                )
                for i in order
            ],
            usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
            meta=RerankMeta(
                billed_units=RerankBilledUnits(search_units=-(-len(docs) // DOCUMENTS_PER_SEARCH_UNIT))
            ),
        )
        return json_response(response)


class ScoreServing(Serving[ScoreRequest]):
    """vLLM's score: one score per (text_1, text_2) pair, in pair order."""

    endpoint: ClassVar[str] = "score"
    task: ClassVar[Task | tuple[Task, ...] | None] = ("rerank", "embed")

    async def respond(self) -> Response:
        body = self.body
        model = self.resolve()
        rid = new_id("score")
        scores, tokens = await score_pairs(
            model, rid, body.pairs(), param="text_2", use_activation=body.use_activation
        )
        response = ScoreResponse(
            id=rid,
            model=body.model,
            data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
            usage=ScoreUsage(prompt_tokens=tokens, total_tokens=tokens),
        )
        return json_response(response)
