"""`POST /tokenize` and `POST /detokenize`, in vLLM's shapes (so tools written for vLLM work)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from raygate.protocol.base import RequestModel, ResponseModel
from raygate.protocol.chat import ChatMessageIn
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import ChatMessage, TokenizeRequest, ToolsSpec
from raygate.protocol.tools import MAX_TOOLS, ToolDefinition, tools_spec


class TokenizeBody(RequestModel):
    """Either `prompt` (vLLM's TokenizeCompletionRequest) or `messages` (TokenizeChatRequest)."""

    model: str = Field(min_length=1)
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeBody:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either `prompt` or `messages`")
        return self

    def unsupported_fields(self) -> list[str]:
        return [
            name
            for name in ("continue_final_message", "chat_template", "chat_template_kwargs")
            if getattr(self, name)
        ]

    def to_engine(self) -> TokenizeRequest:
        messages: list[ChatMessage] | None = None
        tools: ToolsSpec | None = None
        if self.messages is not None:
            messages = []
            for i, m in enumerate(self.messages):
                if m.role == "tool" and not m.tool_call_id:
                    raise BadRequestError("A `tool` message needs `tool_call_id`.", param="messages")
                calls = [c.to_engine() for c in m.tool_calls] if m.tool_calls else None
                messages.append(ChatMessage(m.role, m.text(i), m.name, calls, m.tool_call_id))
            tools = tools_spec(self.tools, None, None)
        # vLLM's defaults: special tokens for plain text, none added around a rendered chat.
        special = self.add_special_tokens if self.add_special_tokens is not None else messages is None
        return TokenizeRequest(
            prompt=self.prompt,
            messages=messages,
            add_special_tokens=special,
            add_generation_prompt=self.add_generation_prompt,
            tools=tools,
        )


class TokenizeResponse(ResponseModel):
    """vLLM's `/tokenize` answer: the ids, their count and the model's context length; `token_strs` only when
    `return_token_strs` asked for it."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None

    omit_when_none: ClassVar[frozenset[str]] = frozenset({"token_strs"})


class DetokenizeBody(RequestModel):
    """vLLM's `/detokenize` body: ids from `model`'s vocabulary (an id outside it is a 400)."""

    model: str = Field(min_length=1)
    tokens: list[int] = Field(min_length=1)


class DetokenizeResponse(ResponseModel):
    """vLLM's `/detokenize` answer: the ids decoded to text, in a field named `prompt` as vLLM names it."""

    prompt: str
