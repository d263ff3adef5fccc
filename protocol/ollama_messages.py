"""A chat turn in Ollama's shape, and the OpenAI turns it becomes.

Its own room because a turn is where the two APIs differ most: Ollama's calls carry no ids, its
`tool` turns name the tool rather than the call, and its images ride on the turn as base64 rather
than as parts. The requests in protocol/ollama.py hand their turns (and `/api/generate` its
images) here.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from raygate.protocol.base import RequestModel
from raygate.protocol.chat import ChatMessageIn, ContentPart, ImageURL
from raygate.protocol.tools import FunctionCallIn, ToolCallIn


class ToolFunctionCall(RequestModel):
    """A call's function: Ollama sends `arguments` as an object (a JSON string is taken too)."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCallItem(RequestModel):
    """One entry of an assistant message's `tool_calls`, as the client sends history back."""

    id: str | None = None
    function: ToolFunctionCall


class OllamaMessage(RequestModel):
    """A chat turn: `images` ride on the turn, `tool_name` names the tool a `tool` turn answers."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    thinking: str | None = None


def chat_messages(messages: list[OllamaMessage]) -> list[ChatMessageIn]:
    """Ollama's turns as OpenAI's. Ollama's calls carry no ids and its `tool` turns name the tool
    (`tool_name`), not the call: each call gets an id, and each tool turn the id of the oldest
    unanswered call of that name (or, unnamed, the oldest unanswered call)."""
    out: list[ChatMessageIn] = []
    pending: list[tuple[str, str]] = []  # (call id, function name), oldest first
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                pending.append((call_id, call.function.name))
                arguments = call.function.arguments
                text = arguments if isinstance(arguments, str) else json.dumps(arguments)
                calls.append(
                    ToolCallIn(id=call_id, function=FunctionCallIn(name=call.function.name, arguments=text))
                )
            out.append(ChatMessageIn(role="assistant", content=m.content or "", tool_calls=calls))
        elif m.role == "tool":
            match = next((p for p in pending if m.tool_name in (None, p[1])), None)
            if match is not None:
                pending.remove(match)
            call_id = m.tool_call_id or (match[0] if match else f"call_{i}")
            out.append(
                ChatMessageIn(role="tool", content=m.content or "", tool_call_id=call_id, name=m.tool_name)
            )
        elif m.images:
            out.append(
                ChatMessageIn(role=m.role, content=image_parts(m.images, f"messages[{i}].images", m.content))
            )
        else:
            out.append(ChatMessageIn(role=m.role, content=m.content or ""))
    return out


def image_parts(images: list[str], where: str, text: str | None) -> list[ContentPart]:
    """Ollama's base64 images as chat's `image_url` parts (data URLs, the format read from the bytes),
    then the text; each part remembers its Ollama field path."""
    parts = []
    for j, data in enumerate(images):
        part = ContentPart(type="image_url", image_url=ImageURL(url=f"data:;base64,{data}"))
        part._param = f"{where}[{j}]"
        parts.append(part)
    if text:
        parts.append(ContentPart(type="text", text=text))
    return parts
