"""`OutputBuilder`: one sequence's deltas become the Responses `output` items, and the stream
events that announce them, in the documented order.

Chat streams one chunk per delta; the Responses API instead opens and closes *items*: a message
(`output_item.added`, `content_part.added`, text deltas, `output_text.done`, `content_part.done`,
`output_item.done`) and one `function_call` item per call (`output_item.added`, argument deltas,
`function_call_arguments.done`, `output_item.done`). That is a small state machine over the
deltas, kept here so that the streamed and the non-streamed answer are built by the same code (the
non-streamed one feeds the collected deltas in as one and ignores the events).

Whitespace before the first visible character is held back: a model that writes `"\\n"` and then
a tool call must not leave an empty message item in front of the call (chat drops such content
too). It is shown if visible text follows, or if the answer ends with no call.

A reasoning model's thinking (`Delta.reasoning`) comes first, as a `reasoning` item
(`output_item.added`, `reasoning_text.delta`s, `reasoning_text.done`, `output_item.done`). When
the request asks for a summary (`reasoning.summary`), the item's `summary` holds one
`summary_text` part with the same text (no summariser model here: docs/reasoning.md), streamed
as `reasoning_summary_part.added`, `reasoning_summary_text.delta`s beside the text deltas,
`reasoning_summary_text.done` and `reasoning_summary_part.done`.
"""

from __future__ import annotations

from typing import Literal

from raygate.protocol.generation import Delta, FinishReason, ToolCallDelta
from raygate.protocol.response_events import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    OutputItemEvent,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    ResponseEvent,
    ResponseLifecycleEvent,
    SummaryPartEvent,
    SummaryTextDeltaEvent,
    SummaryTextDoneEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from raygate.protocol.response_items import (
    FunctionCallItem,
    ItemStatus,
    OutputMessageItem,
    OutputTextContent,
    ReasoningItem,
    ReasoningTextContent,
    SummaryTextContent,
    item_id,
)
from raygate.protocol.response_object import ResponseObject

LifecycleType = Literal[
    "response.created", "response.in_progress", "response.completed", "response.incomplete", "response.failed"
]


class OutputBuilder:
    """Output items and stream events of one response; numbers every event it makes."""

    def __init__(self, summary: bool = False) -> None:
        """`summary`: the request asked for a reasoning summary."""
        self._summary = summary
        self.items: list[OutputMessageItem | FunctionCallItem | ReasoningItem] = []
        self.finish_reason: FinishReason | None = None
        self._seq = 0
        self._kind: Literal["reasoning", "message", "call"] | None = None  # the open item
        self._id = ""
        self._pieces: list[str] = []
        self._call_id = ""
        self._call_name = ""
        self._pending = ""  # leading whitespace not shown yet

    def number(self) -> int:
        """The next event's sequence number."""
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def lifecycle(self, kind: LifecycleType, response: ResponseObject) -> ResponseLifecycleEvent:
        return ResponseLifecycleEvent(type=kind, sequence_number=self.number(), response=response)

    @property
    def status(self) -> ItemStatus:
        """How the items end: cut by the token limit, or whole."""
        return "incomplete" if self.finish_reason == "length" else "completed"

    # --- feeding ---------------------------------------------------------------------------------

    def add(self, delta: Delta) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        if delta.reasoning:
            self._thinking(delta.reasoning, events)
        if delta.text:
            self._text(delta.text, events)
        for piece in delta.tool_calls or ():
            self._call_piece(piece, events)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        return events

    def close(self) -> list[ResponseEvent]:
        """End the open item; an answer with no item at all still gets its (maybe empty) message."""
        events: list[ResponseEvent] = []
        if self._kind in (None, "reasoning") and not any(i.type != "reasoning" for i in self.items):
            self._close(self.status, events)
            self._open_message(events)
            if self._pending:
                self._text_delta(self._pending, events)
        self._close(self.status, events)
        return events

    def _thinking(self, text: str, events: list[ResponseEvent]) -> None:
        if self._kind != "reasoning":
            self._close("completed", events)
            self._kind, self._id, self._pieces = "reasoning", item_id("rs"), []
            item = ReasoningItem(id=self._id, status="in_progress")
            events.append(self._item_event("response.output_item.added", item))
            if self._summary:
                events.append(self._summary_part("response.reasoning_summary_part.added", ""))
        self._pieces.append(text)
        events.append(
            ReasoningTextDeltaEvent(
                sequence_number=self.number(),
                item_id=self._id,
                output_index=len(self.items),
                content_index=0,
                delta=text,
            )
        )
        if self._summary:
            events.append(
                SummaryTextDeltaEvent(
                    sequence_number=self.number(),
                    item_id=self._id,
                    output_index=len(self.items),
                    summary_index=0,
                    delta=text,
                )
            )

    def _text(self, text: str, events: list[ResponseEvent]) -> None:
        if self._kind != "message":
            text, self._pending = self._pending + text, ""
            if not text.strip():
                self._pending = text
                return
            self._close("completed", events)
            self._open_message(events)
        self._text_delta(text, events)

    def _call_piece(self, piece: ToolCallDelta, events: list[ResponseEvent]) -> None:
        if piece.id is not None or self._kind != "call":  # a new call
            self._pending = ""
            self._close("completed", events)
            self._kind, self._id, self._pieces = "call", item_id("fc"), []
            self._call_id, self._call_name = piece.id or item_id("call"), piece.name or ""
            events.append(self._item_event("response.output_item.added", self._call_item("in_progress")))
        if piece.arguments:
            self._pieces.append(piece.arguments)
            events.append(
                ArgumentsDeltaEvent(
                    sequence_number=self.number(),
                    item_id=self._id,
                    output_index=len(self.items),
                    delta=piece.arguments,
                )
            )

    # --- items -----------------------------------------------------------------------------------

    def _open_message(self, events: list[ResponseEvent]) -> None:
        self._kind, self._id, self._pieces = "message", item_id("msg"), []
        events.append(self._item_event("response.output_item.added", self._message_item("in_progress", [])))
        events.append(self._part_event("response.content_part.added", ""))

    def _text_delta(self, text: str, events: list[ResponseEvent]) -> None:
        self._pieces.append(text)
        events.append(
            TextDeltaEvent(
                sequence_number=self.number(),
                item_id=self._id,
                output_index=len(self.items),
                content_index=0,
                delta=text,
            )
        )

    def _close(self, status: ItemStatus, events: list[ResponseEvent]) -> None:
        if self._kind is None:
            return
        whole = "".join(self._pieces)
        index = len(self.items)
        item: OutputMessageItem | FunctionCallItem | ReasoningItem
        if self._kind == "reasoning":
            events.append(
                ReasoningTextDoneEvent(
                    sequence_number=self.number(),
                    item_id=self._id,
                    output_index=index,
                    content_index=0,
                    text=whole,
                )
            )
            summary: list[SummaryTextContent] = []
            if self._summary:
                events.append(
                    SummaryTextDoneEvent(
                        sequence_number=self.number(),
                        item_id=self._id,
                        output_index=index,
                        summary_index=0,
                        text=whole,
                    )
                )
                events.append(
                    self._summary_part(
                        "response.reasoning_summary_part.done",
                        whole,
                        "incomplete" if status == "incomplete" else None,
                    )
                )
                summary = [SummaryTextContent(text=whole)]
            item = ReasoningItem(
                id=self._id, summary=summary, content=[ReasoningTextContent(text=whole)], status=status
            )
        elif self._kind == "message":
            events.append(
                TextDoneEvent(
                    sequence_number=self.number(),
                    item_id=self._id,
                    output_index=index,
                    content_index=0,
                    text=whole,
                )
            )
            events.append(self._part_event("response.content_part.done", whole))
            item = self._message_item(status, [OutputTextContent(text=whole)])
        else:
            events.append(
                ArgumentsDoneEvent(
                    sequence_number=self.number(),
                    item_id=self._id,
                    output_index=index,
                    name=self._call_name,
                    arguments=whole,
                )
            )
            item = self._call_item(status, whole)
        events.append(self._item_event("response.output_item.done", item))
        self.items.append(item)
        self._kind = None

    def _message_item(self, status: ItemStatus, content: list[OutputTextContent]) -> OutputMessageItem:
        return OutputMessageItem(id=self._id, content=content, status=status)

    def _call_item(self, status: ItemStatus, arguments: str = "") -> FunctionCallItem:
        return FunctionCallItem(
            id=self._id, call_id=self._call_id, name=self._call_name, arguments=arguments, status=status
        )

    def _item_event(
        self,
        kind: Literal["response.output_item.added", "response.output_item.done"],
        item: OutputMessageItem | FunctionCallItem | ReasoningItem,
    ) -> OutputItemEvent:
        index = len(self.items)
        return OutputItemEvent(type=kind, sequence_number=self.number(), output_index=index, item=item)

    def _part_event(
        self, kind: Literal["response.content_part.added", "response.content_part.done"], text: str
    ) -> ContentPartEvent:
        return ContentPartEvent(
            type=kind,
            sequence_number=self.number(),
            item_id=self._id,
            output_index=len(self.items),
            content_index=0,
            part=OutputTextContent(text=text),
        )

    def _summary_part(
        self,
        kind: Literal["response.reasoning_summary_part.added", "response.reasoning_summary_part.done"],
        text: str,
        status: Literal["incomplete"] | None = None,
    ) -> SummaryPartEvent:
        return SummaryPartEvent(
            type=kind,
            sequence_number=self.number(),
            item_id=self._id,
            output_index=len(self.items),
            summary_index=0,
            part=SummaryTextContent(text=text),
            status=status,
        )
