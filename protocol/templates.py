"""Rendering stream chunks from a template cut out of the pydantic model's own JSON.

A streamed completion sends one chunk per token, and all its chunks are identical except for the
text. Building and serialising a pydantic model per token costs several microseconds (vLLM
measured 7.5 µs against 0.8 µs from a template); here the model is rendered once with a marker in
place of the text, and each token's chunk is the JSON before the marker, the text serialised by
pydantic's own encoder, and the JSON after it. The model stays the single source of the wire
format: the template is made from it, and tests check the two renderings are byte-identical.
"""

from __future__ import annotations

import uuid

from pydantic_core import to_json

from raygate.protocol.base import ResponseModel


def text_marker() -> str:
    """A string no real id, model name or token will contain."""
    return f"\x00raygate-text-{uuid.uuid4().hex}\x00"


class TextTemplate:
    """`render(text)` == the JSON of `model` with `marker` replaced by `text`."""

    __slots__ = ("_head", "_tail")

    def __init__(self, model: ResponseModel, marker: str) -> None:
        rendered = model.to_json()
        quoted = to_json(marker).decode()
        head, found, tail = rendered.partition(quoted)
        if not found or quoted in tail:
            raise ValueError("the marker must appear exactly once in the model's JSON")
        self._head, self._tail = head, tail

    def render(self, text: str) -> str:
        return self._head + to_json(text).decode() + self._tail
