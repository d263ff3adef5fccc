"""A chat's images on their way into an engine's prompt, what both engines share: each image stands
in its turn's text as a marker (`place_images`), so the turns go through the same rendering as text
(tool calls, tool results, the system block) and each image stays where the client put it; the
engine then hands the markers to its library: llama.cpp's mtmd reads its own marker in the
rendered prompt, vLLM's chat templates get OpenAI-style content parts (`content_parts`) and place
the model's own image token. Decoding is Pillow's on both, to 8-bit RGB."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from raygate.protocol.generation import ChatMessage, ImageInput


def has_images(messages: list[ChatMessage] | None) -> bool:
    return any(m.parts and m.images for m in messages or ())


def place_images(messages: list[ChatMessage], marker: str) -> tuple[list[ChatMessage], list[ImageInput]]:
    """The turns with each image replaced by `marker` in their text, and the images in order."""
    placed: list[ChatMessage] = []
    images: list[ImageInput] = []
    for m in messages:
        if not m.images:
            placed.append(m)
            continue
        text = "".join(marker if isinstance(p, ImageInput) else p for p in m.parts)
        images.extend(m.images)
        placed.append(dataclasses.replace(m, content=text, parts=()))
    return placed, images


def content_parts(text: str, marker: str) -> str | list[dict[str, str]]:
    """A rendered turn's text as OpenAI-style content parts (`text`, `image`) where it holds
    markers, for a Hugging Face chat template that places the model's image token; else as is."""
    if marker not in text:
        return text
    parts: list[dict[str, str]] = []
    for i, piece in enumerate(text.split(marker)):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def decode_rgb(image: ImageInput) -> Any:
    """The image as a Pillow RGB image (every format the gateway accepts; it has checked the bytes
    and the limits already). Blocking."""
    from PIL import Image

    with Image.open(io.BytesIO(image.data)) as img:
        return img.convert("RGB")
