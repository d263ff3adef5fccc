"""`POST /v1/chat/completions`: request, response and stream-chunk models."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_serializer, model_validator

from protocol.base import RequestModel, ResponseModel
from protocol.common import SamplingFields, Usage
from protocol.errors import BadRequestError
from protocol.generation import ChatMessage, FinishReason, SamplingParams

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(RequestModel):
    type: str
    text: str | None = None


class ChatMessageIn(RequestModel):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self, index: int) -> str:
        """Flatten content parts to text; a part a text-only model cannot read is a 400, not dropped."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        texts: list[str] = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise BadRequestError(
                    f"Content part of type `{part.type}` is not supported by this model "
                    "(it accepts text parts only).",
                    param=f"messages[{index}].content",
                )
            texts.append(part.text)
        return "".join(texts)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _tokens_agree(self) -> ChatCompletionRequest:
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise ValueError("max_tokens and max_completion_tokens disagree; send one of them")
        return self

    def unsupported_fields(self) -> list[str]:
        """Fields sent with a meaning we do not implement yet: refused by name, never dropped."""
        refused = []
        if self.logprobs:
            refused.append("logprobs")
        if self.top_logprobs:
            refused.append("top_logprobs")
        if self.logit_bias:
            refused.append("logit_bias")
        if self.tools:
            refused.append("tools")
        if self.tool_choice not in (None, "none"):
            refused.append("tool_choice")
        if self.response_format and self.response_format.get("type") != "text":
            refused.append("response_format")
        return refused

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_completion_tokens or self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=self.stop_list(),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )

    def to_engine_messages(self) -> list[ChatMessage]:
        return [
            ChatMessage(role=m.role, content=m.text(i), name=m.name) for i, m in enumerate(self.messages)
        ]


class ChatCompletionMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None


class ChatCompletionChoice(ResponseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: None = None
    finish_reason: FinishReason | None


class ChatCompletion(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage


class ChatDelta(ResponseModel):
    """Only the keys that changed: the first delta has `role`, the last may be `{}`."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(ResponseModel):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None

    omit_when_none: ClassVar[frozenset[str]] = frozenset({"usage"})
