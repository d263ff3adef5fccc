"""Anthropic Messages API responses: the message, its stream events, the token count, and the
error body, as the `anthropic` SDK reads them.

Every stream event carries its name as `type`; the SSE `event:` line is taken from that same field
(`MessagesEvent.event`), so the two can never disagree.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import model_serializer

from raygate.protocol.base import ResponseModel
from raygate.protocol.errors import OpenAIError
from raygate.protocol.generation import FinishReason

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn"]

# The engine's finish reasons in Anthropic's words. `abort` (the gateway drained or cancelled the
# request) is `pause_turn`: the turn was cut short and may be continued by sending it again.
STOP_REASONS: dict[FinishReason, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "abort": "pause_turn",
}


def stop_reason(finish: FinishReason | None, stop_sequence: str | None) -> StopReason | None:
    if finish == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return None if finish is None else STOP_REASONS[finish]


def tool_use_id(call_id: str) -> str:
    """Anthropic's id shape (`toolu_…`) for an engine call id (`call_…`): same random part."""
    return "toolu_" + call_id.removeprefix("call_")


class _DropNone(ResponseModel):
    """Optional keys are absent rather than null, as in Anthropic's responses."""

    keep_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None or k in self.keep_none}


class MessagesUsage(_DropNone):
    """`input_tokens` excludes prompt tokens read from the prefix cache; those are
    `cache_read_input_tokens` (absent where the engine does not say)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached: int | None) -> MessagesUsage:
        cached = None if cached is None else min(cached, prompt_tokens)
        return cls(
            input_tokens=prompt_tokens - (cached or 0),
            output_tokens=completion_tokens,
            cache_read_input_tokens=cached,
        )


class TextBlock(ResponseModel):
    """Generated text, one block per run of text between tool calls."""

    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(ResponseModel):
    """A tool call the model made; `input` is the parsed JSON arguments."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ThinkingBlock(ResponseModel):
    """A reasoning model's thinking, before the answer (`thinking` enabled); `signature` lets the
    gateway check the block when a client sends it back (server/serving/thinking_signature.py)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


ContentBlock = ThinkingBlock | TextBlock | ToolUseBlock


class Message(ResponseModel):
    """The non-streamed answer of `POST /v1/messages`, in the shape the `anthropic` SDK parses."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: MessagesUsage


class CountTokensResponse(ResponseModel):
    """The answer of `/v1/messages/count_tokens`: the prompt tokens a create with the same input reports."""

    input_tokens: int


# -- stream events --------------------------------------------------------------------------------


class MessagesEvent(ResponseModel):
    """A stream event; `type` is also its SSE event name."""

    type: str

    @property
    def event(self) -> str:
        return self.type


class MessageStartEvent(MessagesEvent):
    """First event of a stream: the message with empty content and the prompt usage."""

    type: Literal["message_start"] = "message_start"
    message: Message


class ContentBlockStartEvent(MessagesEvent):
    """A text or tool_use block opens at `index`."""

    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


class TextDelta(ResponseModel):
    """A piece of a text block."""

    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(ResponseModel):
    """A piece of a thinking block."""

    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(ResponseModel):
    """A thinking block's signature, its last delta."""

    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class InputJsonDelta(ResponseModel):
    """A piece of a tool_use block's JSON input; the pieces joined parse as the input."""

    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ContentBlockDeltaEvent(MessagesEvent):
    """A delta for the block at `index`."""

    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


class ContentBlockStopEvent(MessagesEvent):
    """The block at `index` is complete."""

    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDeltaBody(_DropNone):
    """What changes at the end of a message: `stop_reason` and `stop_sequence`."""

    keep_none: ClassVar[frozenset[str]] = frozenset({"stop_sequence"})

    stop_reason: StopReason | None
    stop_sequence: str | None = None


class MessageDeltaEvent(MessagesEvent):
    """The stop reason and the final output usage, just before `message_stop`."""

    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: MessagesUsage


class MessageStopEvent(MessagesEvent):
    """Last event of a stream."""

    type: Literal["message_stop"] = "message_stop"


# -- errors ---------------------------------------------------------------------------------------

# Anthropic's error types by HTTP status; the SDK picks its exception class by status.
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class ErrorDetail(ResponseModel):
    """Anthropic's error `type` and message, inside `{"type": "error", "error": ...}`."""

    type: str
    message: str


class ErrorEvent(MessagesEvent):
    """The error body, on the HTTP response before the stream and as the `error` event in it."""

    type: Literal["error"] = "error"
    error: ErrorDetail

    @classmethod
    def of(cls, exc: OpenAIError) -> ErrorEvent:
        status = exc.status_code
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return cls(error=ErrorDetail(type=kind, message=exc.message))
