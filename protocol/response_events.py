"""The server-sent events of a streamed response (`POST /v1/responses` with `stream: true`).

Every event carries its `type` (also sent as the SSE `event:` name) and a `sequence_number`
counting from 0. A stream is `response.created`, `response.in_progress`, then per output item
`response.output_item.added` ... `response.output_item.done` (a message's text inside
`response.content_part.added` / `response.output_text.delta`* / `response.output_text.done` /
`response.content_part.done`; a call's arguments as `response.function_call_arguments.delta`* /
`.done`), and last `response.completed`, `response.incomplete` or `response.failed` (an `error`
event before it says why).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from raygate.protocol.base import ResponseModel
from raygate.protocol.response_items import OutputItem, OutputTextContent, SummaryTextContent
from raygate.protocol.response_object import ResponseObject


class ResponseEvent(ResponseModel):
    """Base of every stream event."""

    type: str
    sequence_number: int


class ResponseLifecycleEvent(ResponseEvent):
    """The response as a whole: created, in progress, and how it ended."""

    type: Literal[
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    response: ResponseObject


class OutputItemEvent(ResponseEvent):
    """An output item starts (`added`, empty and `in_progress`) or ends (`done`, whole)."""

    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(ResponseEvent):
    """A message's text part starts (empty) or ends (whole)."""

    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputTextContent


class TextDeltaEvent(ResponseEvent):
    """A piece of a message's text."""

    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class TextDoneEvent(ResponseEvent):
    """A message's whole text."""

    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningTextDeltaEvent(ResponseEvent):
    """A piece of a reasoning item's thinking."""

    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDoneEvent(ResponseEvent):
    """A reasoning item's whole thinking."""

    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str


class SummaryPartEvent(ResponseEvent):
    """A reasoning item's summary part starts (empty) or ends (whole; `status` only when cut)."""

    type: Literal["response.reasoning_summary_part.added", "response.reasoning_summary_part.done"]
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryTextContent
    status: Literal["incomplete"] | None = None

    omit_when_none: ClassVar[frozenset[str]] = frozenset({"status"})


class SummaryTextDeltaEvent(ResponseEvent):
    """A piece of a reasoning item's summary."""

    type: Literal["response.reasoning_summary_text.delta"] = "response.reasoning_summary_text.delta"
    item_id: str
    output_index: int
    summary_index: int
    delta: str


class SummaryTextDoneEvent(ResponseEvent):
    """A reasoning item's whole summary part."""

    type: Literal["response.reasoning_summary_text.done"] = "response.reasoning_summary_text.done"
    item_id: str
    output_index: int
    summary_index: int
    text: str


class ArgumentsDeltaEvent(ResponseEvent):
    """A piece of a function call's arguments (JSON text)."""

    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(ResponseEvent):
    """A function call's whole arguments."""

    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(ResponseEvent):
    """A failure after the stream started; `response.failed` follows it."""

    type: Literal["error"] = "error"
    code: str | None
    message: str
    param: str | None
