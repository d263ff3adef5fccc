"""`POST /v1/responses`: the items a request's `input` may hold, as OpenAI's SDKs send them.

Each input form (a message with text or image parts, a replayed function call, a function call's
output, a replayed reasoning item) checks its own shape and becomes one of the conversation items
of `protocol/response_items.py` (`to_item`); the request itself (`protocol/responses.py`) only walks
the list. Kept apart from the request so the wire forms of the conversation sit in one place.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import Discriminator, Field, Tag

from raygate.protocol.base import RequestModel
from raygate.protocol.errors import BadRequestError
from raygate.protocol.response_items import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImageContent,
    InputMessageItem,
    InputTextContent,
    OutputMessageItem,
    OutputTextContent,
    ReasoningItem,
    ReasoningTextContent,
    SummaryTextContent,
    item_id,
)

# Content part types whose `text` is plain text a text-only model can read.
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


class InputContentPart(RequestModel):
    """A part of an input message: text, or (in a user turn) `input_image` with `image_url`; any
    other type (`input_file`, an image by `file_id`) is refused by name."""

    type: str
    text: str | None = None
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    file_id: str | None = None


def _part_texts(content: str | list[InputContentPart], param: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type not in TEXT_PARTS or part.text is None:
            raise BadRequestError(
                f"Content part of type `{part.type}` is not supported here (text parts, and "
                "`input_image` parts in user turns to a vision model).",
                param=f"{param}[{i}]",
            )
        texts.append(part.text)
    return "".join(texts)


class MessageInput(RequestModel):
    """A message in `input`: `content` a string or text parts (`input_text`, or `output_text` for
    an assistant turn replayed from an earlier response)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputContentPart]
    id: str | None = None

    def to_item(self, param: str) -> InputMessageItem | OutputMessageItem:
        content = self.content
        if (
            self.role == "user"
            and isinstance(content, list)
            and any(p.type == "input_image" for p in content)
        ):
            return InputMessageItem(id=item_id("msg"), role="user", content=self._parts(param))
        text = _part_texts(self.content, f"{param}.content")
        if self.role == "assistant":
            return OutputMessageItem(
                id=self.id or item_id("msg"), content=[OutputTextContent(text=text)], status="completed"
            )
        return InputMessageItem(id=item_id("msg"), role=self.role, content=[InputTextContent(text=text)])

    def _parts(self, param: str) -> list[InputTextContent | InputImageContent]:
        """A user turn with images: its text and image parts in order (protocol/images.py)."""
        out: list[InputTextContent | InputImageContent] = []
        for j, part in enumerate(cast(list[InputContentPart], self.content)):
            where = f"{param}.content[{j}]"
            if part.type != "input_image":
                if part.type not in TEXT_PARTS or part.text is None:
                    raise BadRequestError(
                        f"Content part of type `{part.type}` is not supported here.", param=where
                    )
                out.append(InputTextContent(text=part.text))
                continue
            if part.image_url is None:
                raise BadRequestError(
                    "An `input_image` part needs `image_url` (images by `file_id` are not supported).",
                    param=f"{where}.image_url",
                )
            image = InputImageContent(image_url=part.image_url, detail=part.detail or "auto")
            image._param = f"{where}.image_url"
            out.append(image)
        return out


class FunctionCallInput(RequestModel):
    """A call the model made in an earlier turn, replayed by the client."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None

    def to_item(self) -> FunctionCallItem:
        return FunctionCallItem(
            id=self.id or item_id("fc"),
            call_id=self.call_id,
            name=self.name,
            arguments=self.arguments,
            status="completed",
        )


class FunctionCallOutputInput(RequestModel):
    """The client's result for a function call (`call_id` names the call)."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=64)
    output: str | list[InputContentPart]
    id: str | None = None

    def to_item(self, param: str) -> FunctionCallOutputItem:
        output = _part_texts(self.output, f"{param}.output")
        return FunctionCallOutputItem(id=self.id or item_id("fco"), call_id=self.call_id, output=output)


class ReasoningInput(RequestModel):
    """A reasoning item from an earlier response, sent back by a client that manages the
    conversation itself: kept in the conversation, not shown to the model again."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[ReasoningTextContent] | None = None
    encrypted_content: str | None = None

    def to_item(self) -> ReasoningItem:
        summary = [
            SummaryTextContent(text=str(part.get("text", "")))
            for part in self.summary or []
            if isinstance(part, dict) and part.get("type") == "summary_text"
        ]
        return ReasoningItem(id=self.id or item_id("rs"), summary=summary, content=list(self.content or []))


class OtherInput(RequestModel):
    """Any other item type (`item_reference`, built-in tool calls): refused by name."""

    type: str


def _input_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if kind in ("message", "function_call", "function_call_output", "reasoning") else "other"


InputItem = Annotated[
    Annotated[MessageInput, Tag("message")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")]
    | Annotated[ReasoningInput, Tag("reasoning")]
    | Annotated[OtherInput, Tag("other")],
    Discriminator(_input_kind),
]
