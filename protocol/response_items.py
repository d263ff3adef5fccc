"""The Responses API's conversation items, and how a conversation becomes chat turns.

Every item a request brings in and every item the model produces is normalised to one of four
shapes (OpenAI's `ItemResource` shapes, with ids): what `input_items` lists, what a stored
response keeps for `previous_response_id`, and what `engine_messages` turns into the engine's
`ChatMessage`s, so both engines serve the Responses API through the same path as chat.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag

from raygate.protocol.base import ResponseModel
from raygate.protocol.generation import ChatMessage, ImageInput, ToolCall
from raygate.protocol.images import ImageReader, ImageRef, text_only, turn_content

ItemStatus = Literal["in_progress", "completed", "incomplete"]


def item_id(prefix: str) -> str:
    """OpenAI's id shape for items and responses: `msg_…`, `fc_…`, `resp_…`."""
    return f"{prefix}_{uuid.uuid4().hex}"


class InputTextContent(ResponseModel):
    """A text part of a user, system or developer message."""

    type: Literal["input_text"] = "input_text"
    text: str


class InputImageContent(ResponseModel):
    """An image part of a user turn (`image_url`: a `data:` URL, or an `http(s)` URL the gateway
    fetches when allowed); kept as sent, so a later turn (`previous_response_id`) sees it again."""

    type: Literal["input_image"] = "input_image"
    image_url: str
    detail: Literal["auto", "low", "high"] = "auto"
    # Its field path in the request that sent it, for errors; unset in a stored conversation.
    _param: str | None = PrivateAttr(None)

    def image_ref(self, fallback: str) -> ImageRef:
        return ImageRef(self.image_url, self._param or fallback, self.detail)


class OutputTextContent(ResponseModel):
    """The text part of an assistant message (no annotations or logprobs are produced)."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class InputMessageItem(ResponseModel):
    """A user, system or developer turn."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer"]
    content: list[Annotated[InputTextContent | InputImageContent, Field(discriminator="type")]]
    status: ItemStatus = "completed"

    def parts(self, where: str, see: ImageReader) -> list[str | ImageInput]:
        return [
            p.text if isinstance(p, InputTextContent) else see(p.image_ref(f"{where}.content[{j}]"))
            for j, p in enumerate(self.content)
        ]


class OutputMessageItem(ResponseModel):
    """An assistant turn: generated here, or replayed by a client as input."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextContent]
    status: ItemStatus

    def text(self) -> str:
        return "".join(part.text for part in self.content)


class ReasoningTextContent(ResponseModel):
    """A reasoning model's thinking, as text."""

    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class SummaryTextContent(ResponseModel):
    """A part of a reasoning item's `summary`, made when the request asks (`reasoning.summary`).
    A local server has no summariser model: the part holds the thinking itself, as Ollama's and
    other local servers' Responses APIs do (docs/reasoning.md)."""

    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningItem(ResponseModel):
    """A reasoning model's thinking before its answer. Kept in the conversation, and not shown to
    the model again in later turns (its chat template drops earlier thinking too)."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[SummaryTextContent] = Field(default_factory=list)
    content: list[ReasoningTextContent] = Field(default_factory=list)
    status: ItemStatus = "completed"


class FunctionCallItem(ResponseModel):
    """A call the model made; `call_id` pairs it with its `function_call_output`."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class FunctionCallOutputItem(ResponseModel):
    """The result of a function call, as the client sent it back."""

    id: str
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str
    status: ItemStatus = "completed"


def _conversation_kind(value: Any) -> str:
    """Both message shapes have `type: message`: the role tells them apart."""
    get = value.get if isinstance(value, dict) else lambda k, d=None: getattr(value, k, d)
    kind = str(get("type", "message"))
    if kind == "message":
        return "assistant" if get("role") == "assistant" else "message"
    return kind


# One conversation item, as code handles it (`ConversationItem` is the same, tagged for parsing).
Item = InputMessageItem | OutputMessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem

ConversationItem = Annotated[
    Annotated[InputMessageItem, Tag("message")]
    | Annotated[OutputMessageItem, Tag("assistant")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_conversation_kind),
]
OutputItem = Annotated[
    Annotated[OutputMessageItem, Tag("assistant")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_conversation_kind),
]


def engine_messages(
    instructions: str | None, items: list[Item], see: ImageReader = text_only
) -> list[ChatMessage]:
    """The conversation as chat turns: instructions first (a system turn), function calls folded
    into the assistant turn they follow (as chat's `tool_calls`), their outputs as `tool` turns.
    Images go through `see` (protocol/images.py); one from a stored turn is named by its place."""
    out = [ChatMessage(role="system", content=instructions)] if instructions else []
    names: dict[str, str] = {}
    for k, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            continue  # earlier thinking is not shown to the model again
        if isinstance(item, InputMessageItem):
            content, parts = turn_content(item.parts(f"conversation[{k}]", see))
            out.append(ChatMessage(role=item.role, content=content, parts=parts))
        elif isinstance(item, OutputMessageItem):
            out.append(ChatMessage(role="assistant", content=item.text()))
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            call = ToolCall(item.call_id, item.name, item.arguments)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        else:
            out.append(
                ChatMessage(
                    role="tool", content=item.output, name=names.get(item.call_id), tool_call_id=item.call_id
                )
            )
    return out
