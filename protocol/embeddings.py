"""`POST /v1/embeddings`: request and response."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from typing import Literal, cast

from pydantic import Field, field_validator

from raygate.protocol.base import RequestModel, ResponseModel


def unit_vector(vec: Sequence[float]) -> list[float]:
    """`vec` scaled to length 1 (a zero vector stays zero): OpenAI's embeddings are unit-normalised,
    so cosine similarity is a dot product for clients, whatever the model's pooling returns."""
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(RequestModel):
    """Body of `POST /v1/embeddings`: text or token ids, one input or a batch. `dimensions` keeps the first d
    components and renormalises them."""

    model: str = Field(min_length=1)
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    # vLLM's: admission order in the gateway (lower first); see server/serving/admission.py.
    priority: int | None = Field(None, ge=-(2**31), le=2**31 - 1)

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: EmbeddingInput) -> EmbeddingInput:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        if isinstance(value, list) and any(isinstance(x, (str, list)) and not x for x in value):
            raise ValueError("input must not contain empty strings or empty token lists")
        if isinstance(value, str) and not value:
            raise ValueError("input must not be an empty string")
        return value

    def inputs(self) -> list[str] | list[list[int]]:
        """Normalise OpenAI's four input forms to a batch."""
        x = self.input
        if isinstance(x, str):
            return [x]
        if all(isinstance(v, int) for v in x):
            return [cast(list[int], x)]
        return cast(list[str] | list[list[int]], list(x))


class Embedding(ResponseModel):
    """One input's vector at the input's `index`: floats, or a base64 string of float32s when
    `encoding_format` is `base64`."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str

    @staticmethod
    def encode(vector: list[float], encoding_format: str) -> list[float] | str:
        """base64 is little-endian float32, which is what the openai SDK decodes with numpy."""
        if encoding_format == "base64":
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        return vector


class EmbeddingUsage(ResponseModel):
    """Usage for embeddings: prompt tokens only, since nothing is generated."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(ResponseModel):
    """OpenAI's list envelope for `POST /v1/embeddings`: one `Embedding` per input, in input order."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
