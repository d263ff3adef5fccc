"""`TokenizeServing` and `DetokenizeServing`: vLLM's `/tokenize` and `/detokenize`, for every model.

They reach the engine through the model handle like every other call, so they wait their turn
behind `max_running`, are bounded by the request deadline and are ended by a drain.
"""

from __future__ import annotations

from typing import ClassVar

from fastapi.responses import Response

from raygate.protocol.config import Task
from raygate.protocol.tokenize import DetokenizeBody, DetokenizeResponse, TokenizeBody, TokenizeResponse
from raygate.server.serving.base import Serving, json_response


class TokenizeServing(Serving[TokenizeBody]):
    """The token ids (and optionally their texts) a model would see for a prompt or a chat."""

    endpoint: ClassVar[str] = "tokenize"
    task: ClassVar[Task | None] = None

    async def respond(self) -> Response:
        body = self.body
        model = self.resolve()
        result = await model.tokenize(body.to_engine())
        return json_response(
            TokenizeResponse(
                count=len(result.tokens),
                max_model_len=result.max_model_len,
                tokens=result.tokens,
                token_strs=result.token_strs if body.return_token_strs else None,
            )
        )


class DetokenizeServing(Serving[DetokenizeBody]):
    """The text of token ids."""

    endpoint: ClassVar[str] = "detokenize"
    task: ClassVar[Task | None] = None

    async def respond(self) -> Response:
        model = self.resolve()
        text = await model.detokenize(self.body.tokens)
        return json_response(DetokenizeResponse(prompt=text))
