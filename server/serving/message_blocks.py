"""`BlockStream`: engine deltas as Anthropic's content-block events.

An Anthropic message is a list of content blocks, streamed as `content_block_start`, its
`content_block_delta`s and `content_block_stop`, one block at a time. The engine's deltas carry
text and tool-call pieces (the same deltas chat completions render); this turns them into blocks:
text opens a text block or continues the open one, each new tool call closes what is open and
opens a `tool_use` block whose arguments stream as `input_json_delta`, and the end of the message
closes the last block. A reasoning model's thinking (`Delta.reasoning`) comes first, as a
`thinking` block of `thinking_delta`s closed by its `signature_delta`.

Whitespace alone does not open a text block: it is held and sent with the next text, or dropped if
none follows (a model's newline before its tool call is not an answer). The non-streamed body
applies the same rule (`server/serving/messages.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from raygate.protocol.generation import Delta, ToolCallDelta
from raygate.protocol.messages_response import (
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    InputJsonDelta,
    MessagesEvent,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
    tool_use_id,
)
from raygate.protocol.templates import TextTemplate, text_marker
from raygate.server.serving.streaming import Event


def event(model: MessagesEvent) -> Event:
    """The SSE event of a model: its name is its own `type`."""
    return Event(model.event, model.to_json())


class BlockStream:
    """The content-block events of one message, delta by delta."""

    def __init__(self, sign: Callable[[str], str] = str) -> None:
        """`sign`: a thinking block's signature, from its whole text."""
        self._sign = sign
        self._thought: list[str] = []  # the open thinking block's text so far
        self._index = -1  # the open (or last) block
        self._open: str | None = None  # "thinking", "text" or "tool_use"
        self._held = ""  # whitespace waiting for text
        self._marker = text_marker()
        self._template: TextTemplate | None = None  # the text_delta of the open text block

    def push(self, delta: Delta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            self._thinking(delta.reasoning, events)
        if delta.text:
            self._text(delta.text, events)
        for piece in delta.tool_calls or ():
            self._call(piece, events)
        return events

    def close(self) -> list[Event]:
        """The stop of the open block, if any (the message is ending)."""
        if self._open is None:
            return []
        events = []
        if self._open == "thinking":
            signature = SignatureDelta(signature=self._sign("".join(self._thought)))
            events.append(event(ContentBlockDeltaEvent(index=self._index, delta=signature)))
        self._open = None
        return [*events, event(ContentBlockStopEvent(index=self._index))]

    def _thinking(self, text: str, events: list[Event]) -> None:
        if self._open != "thinking":
            self._thought = []
            self._start(ThinkingBlock(thinking="", signature=""), events)
        self._thought.append(text)
        events.append(event(ContentBlockDeltaEvent(index=self._index, delta=ThinkingDelta(thinking=text))))

    def _start(self, block: ThinkingBlock | TextBlock | ToolUseBlock, events: list[Event]) -> None:
        events += self.close()
        self._index += 1
        self._open = block.type
        events.append(event(ContentBlockStartEvent(index=self._index, content_block=block)))

    def _text(self, text: str, events: list[Event]) -> None:
        if self._open != "text":
            if not (self._held + text).strip():
                self._held += text
                return
            text, self._held = self._held + text, ""
            self._start(TextBlock(text=""), events)
            model = ContentBlockDeltaEvent(index=self._index, delta=TextDelta(text=self._marker))
            self._template = TextTemplate(model, self._marker)
        assert self._template is not None
        # The per-token path: one template render (protocol/templates.py).
        events.append(Event("content_block_delta", self._template.render(text)))

    def _call(self, piece: ToolCallDelta, events: list[Event]) -> None:
        if piece.id is not None:  # a call's first piece names it
            self._held = ""
            block = ToolUseBlock(id=tool_use_id(piece.id), name=piece.name or "", input={})
            self._start(block, events)
        if piece.arguments and self._open == "tool_use":
            delta = InputJsonDelta(partial_json=piece.arguments)
            events.append(event(ContentBlockDeltaEvent(index=self._index, delta=delta)))
