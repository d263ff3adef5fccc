"""`EmbeddingServing`: `POST /v1/embeddings` on the serving base."""

from __future__ import annotations

from typing import ClassVar

from fastapi.responses import Response

from raygate.protocol.config import Task
from raygate.protocol.embeddings import (
    Embedding,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    unit_vector,
)
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import EmbedRequest, EmbedResult
from raygate.server.serving.base import Serving, json_response
from raygate.server.serving.ids import new_id


def shorten(vector: list[float], dimensions: int | None) -> list[float]:
    """OpenAI's `dimensions`: keep the first d components, then renormalise to unit length."""
    if dimensions is None or dimensions == len(vector):
        return vector
    if dimensions > len(vector):
        raise BadRequestError(
            f"`dimensions` must be at most {len(vector)} for this model.", param="dimensions"
        )
    return unit_vector(vector[:dimensions])


class EmbeddingServing(Serving[EmbeddingRequest]):
    """One batch of inputs, embedded in one engine call (the handle bounds it by the deadline)."""

    endpoint: ClassVar[str] = "embeddings"
    task: ClassVar[Task | None] = "embed"

    async def embedded(self) -> EmbedResult:
        """The body's inputs embedded by its model, each vector shortened to `dimensions`."""
        body = self.body
        model = self.resolve()
        result = await model.embed(EmbedRequest(new_id("embd"), body.inputs()))
        result.embeddings = [shorten(v, body.dimensions) for v in result.embeddings]
        return result

    async def respond(self) -> Response:
        body = self.body
        result = await self.embedded()
        response = EmbeddingResponse(
            data=[
                Embedding(index=i, embedding=Embedding.encode(v, body.encoding_format))
                for i, v in enumerate(result.embeddings)
            ],
            model=body.model,
            usage=EmbeddingUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens),
        )
        return json_response(response)
