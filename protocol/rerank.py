"""`POST /v1/rerank` (also `/rerank`, `/v2/rerank`) and `POST /v1/score`: requests and responses.

Rerank takes the request Jina, Cohere (v1 and v2 SDKs) and vLLM send: a `query` and `documents`
(strings, or objects with `text`), optional `top_n` and `return_documents`; it answers `results`
best first. Score is vLLM's: `text_1` and `text_2`, each a string or a list, paired 1:1, 1:N or
N:N, answered as `data: [{index, score}]` in pair order.

`use_activation` (vLLM's field): a cross-encoder's logit goes through a sigmoid by default, as
vLLM and sentence-transformers' `CrossEncoder` do, so scores are in (0, 1) like Cohere's;
`false` returns the raw logit. An embedding model's score is the cosine similarity of the two
texts' vectors, in [-1, 1], whatever `use_activation` says.
"""

from __future__ import annotations

import time
from typing import ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from raygate.protocol.base import NestedOmitsNone, RequestModel, ResponseModel


class DocumentText(BaseModel):
    """A document as an object (Cohere v1, Jina): only `text` is read; other keys are ignored."""

    text: str


RerankDocument = str | DocumentText


class RerankRequest(RequestModel):
    """Body of `POST /v1/rerank`. An empty `query` or `documents` is a 400 naming the field; the
    per-model cap on documents (`limits.max_documents`) is checked once the model is known."""

    model: str = Field(min_length=1)
    query: str
    documents: list[RerankDocument]
    top_n: int | None = Field(None, ge=1)
    # Absent: documents come back (Jina's and vLLM's default); Xinference's client sends null
    # for "not asked", which returns none, as Xinference does.
    return_documents: bool | None = True
    use_activation: bool | None = None

    @field_validator("query")
    @classmethod
    def _query(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must not be empty")
        return value

    @field_validator("documents")
    @classmethod
    def _documents(cls, value: list[RerankDocument]) -> list[RerankDocument]:
        if not value:
            raise ValueError("documents must not be an empty list")
        for i, doc in enumerate(value):
            if not (doc if isinstance(doc, str) else doc.text).strip():
                raise ValueError(f"documents[{i}] must not be empty")
        return value

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankedDocument(ResponseModel):
    """A returned document's text (`return_documents`)."""

    text: str


class RerankResult(NestedOmitsNone):
    """One document: its index in the request, its score, and (unless `return_documents` is false)
    its text."""

    index: int
    relevance_score: float
    document: RerankedDocument | None = None
    # `return_documents: false`: no `document` key at all, as Cohere answers.
    omit_when_none: ClassVar[frozenset[str]] = frozenset({"document"})


class RerankUsage(ResponseModel):
    """Tokens the model read for all pairs; nothing is generated."""

    prompt_tokens: int
    total_tokens: int


class RerankBilledUnits(ResponseModel):
    """Cohere's `meta.billed_units`: one search unit per request (up to 100 documents each)."""

    search_units: int


class RerankMeta(ResponseModel):
    """Cohere's `meta` block; its SDKs read `billed_units`."""

    billed_units: RerankBilledUnits


class RerankResponse(ResponseModel):
    """Results best first, cut to `top_n`; usage in OpenAI's words and Cohere's `meta`."""

    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage
    meta: RerankMeta


ScoreText = str | list[str]


class ScoreRequest(RequestModel):
    """Body of vLLM's `POST /v1/score`."""

    model: str = Field(min_length=1)
    text_1: ScoreText
    text_2: ScoreText
    use_activation: bool | None = None

    @field_validator("text_1", "text_2")
    @classmethod
    def _non_empty(cls, value: ScoreText) -> ScoreText:
        texts = [value] if isinstance(value, str) else value
        if not texts:
            raise ValueError("must not be an empty list")
        if any(not t.strip() for t in texts):
            raise ValueError("must not hold an empty text")
        return value

    @model_validator(mode="after")
    def _pairable(self) -> ScoreRequest:
        left, right = self._sides()
        if len(left) != 1 and len(left) != len(right):
            raise ValueError(
                f"text_1 has {len(left)} texts and text_2 has {len(right)}: "
                "send one text_1, or as many as text_2"
            )
        return self

    def _sides(self) -> tuple[list[str], list[str]]:
        left = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        right = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        return left, right

    def pairs(self) -> list[tuple[str, str]]:
        """vLLM's pairing: one `text_1` against every `text_2` (1:N), or element-wise (N:N)."""
        left, right = self._sides()
        if len(left) == 1:
            return [(left[0], r) for r in right]
        return list(zip(left, right, strict=True))


class ScoreData(ResponseModel):
    """One pair's score, at the pair's index."""

    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreUsage(ResponseModel):
    """vLLM's usage for score: prompt tokens only."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(ResponseModel):
    """vLLM's score body: one entry per pair, in pair order."""

    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
