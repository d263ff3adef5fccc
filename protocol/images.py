"""Images in a request, before and after the gateway reads them (docs/vision.md).

Every API spells an image its own way (chat's `image_url` part, the Responses API's
`input_image`, Anthropic's `image` block, Ollama's `images`); each translation meets them while it
builds the engine's `ChatMessage`s and hands each to an `ImageReader` as an `ImageRef`: the
reference (a `data:` URL or an `http(s)` URL) and where it sits in the body, for the error that
names it. The same walk runs twice: once with an `ImageRefs` recorder (what to read), then, once
the gateway has read and checked every image (server/serving/images.py), with `resolved(...)`,
which places each `ImageInput` in its turn's `parts`. So each API's field paths are written once,
in its translation, and protocol/ stays free of I/O.

Without a reader (`text_only`, the default), an image is the 400 a text-only path always gave.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import ImageInput


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image a request refers to, not yet read. `param` is its field path in the client's body
    (`messages[0].content[1].image_url`, `messages[0].images[0]`); `detail` is accepted and not
    used (the projector's resolution is fixed by the model)."""

    url: str
    param: str
    detail: str | None = None


ImageReader = Callable[[ImageRef], ImageInput]

# What the recording pass places where an image will be: never sent to an engine.
_PLACEHOLDER = ImageInput(data=b"", digest="", width=0, height=0, format="")


class ImageRefs:
    """The recording pass's reader: every image of the body, in the client's order."""

    def __init__(self) -> None:
        self.refs: list[ImageRef] = []

    def __call__(self, ref: ImageRef) -> ImageInput:
        self.refs.append(ref)
        return _PLACEHOLDER


def resolved(images: Mapping[str, ImageInput]) -> ImageReader:
    """The second pass's reader: the image read for each field path."""

    def read(ref: ImageRef) -> ImageInput:
        image = images.get(ref.param)
        if image is None:  # a path walked on the second pass only: not read, so not sent
            raise BadRequestError(f"`{ref.param}`: this image was not read.", param=ref.param)
        return image

    return read


def text_only(ref: ImageRef) -> ImageInput:
    """The reader of a path that takes no images (token counting of a text model, say)."""
    raise BadRequestError(
        f"`{ref.param}`: image input is not supported here (this request reads text only).",
        param=ref.param,
    )


def turn_content(parts: Sequence[str | ImageInput]) -> tuple[str, tuple[str | ImageInput, ...]]:
    """A turn's `content` (its text parts joined) and `parts` (empty for a text-only turn, as
    `ChatMessage` wants it)."""
    text = "".join(p for p in parts if isinstance(p, str))
    has_image = any(isinstance(p, ImageInput) for p in parts)
    return text, (tuple(parts) if has_image else ())
