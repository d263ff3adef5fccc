"""`POST /v1/chat/completions`: request, response and stream-chunk models."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_serializer, model_validator

from raygate.protocol.base import NestedOmitsNone, RequestModel, ResponseModel
from raygate.protocol.common import SamplingFields, Usage
from raygate.protocol.errors import BadRequestError
from raygate.protocol.extensions import fold_n_probs
from raygate.protocol.generation import ChatMessage, FinishReason, ImageInput, SamplingParams, ToolsSpec
from raygate.protocol.images import ImageReader, ImageRef, text_only, turn_content
from raygate.protocol.reasoning import thinking_control
from raygate.protocol.tools import (
    MAX_TOOLS,
    ChoiceLogprobs,
    ResponseFormat,
    ToolCallChunk,
    ToolCallIn,
    ToolCallOut,
    ToolChoice,
    ToolDefinition,
    check_tool_schemas,
    tools_spec,
)

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ImageURL(RequestModel):
    """An `image_url` part's image: a `data:` URL, or an `http(s)` URL the gateway fetches only when
    the operator allows its host (`--image-fetch-domain`, docs/vision.md). `detail` is accepted."""

    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ContentPart(RequestModel):
    """One element of a `content` array. Any `type` parses, so a part no model here reads (audio,
    files) is refused with a 400 naming it (`ChatMessageIn.parts`) rather than a validation error."""

    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None
    # Where this part came from when a translation made it (Ollama's `messages[0].images[1]`):
    # the field path an error names instead of chat's.
    _param: str | None = PrivateAttr(None)

    def image_ref(self, param: str) -> ImageRef:
        where = self._param or f"{param}.image_url"
        if self.image_url is None:
            raise BadRequestError("An `image_url` part needs `image_url.url`.", param=where)
        if isinstance(self.image_url, str):  # vLLM takes the URL alone too
            return ImageRef(self.image_url, where)
        return ImageRef(self.image_url.url, where, self.image_url.detail)


class ChatMessageIn(RequestModel):
    """A chat turn as clients send it, any role OpenAI defines (`developer` and legacy `function` included);
    becomes the engine's `ChatMessage` (its text, and its images in `parts`)."""

    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def parts(self, index: int, see: ImageReader = text_only) -> list[str | ImageInput]:
        """The content's text and images in order; a part no model here reads is a 400, not dropped."""
        if self.content is None:
            return []
        if isinstance(self.content, str):
            return [self.content]
        out: list[str | ImageInput] = []
        for j, part in enumerate(self.content):
            if part.type == "image_url" and self.role == "user":
                out.append(see(part.image_ref(f"messages[{index}].content[{j}]")))
            elif part.type != "text" or part.text is None:
                raise BadRequestError(
                    f"Content part of type `{part.type}` is not supported here "
                    "(text parts, and `image_url` parts in user turns to a vision model).",
                    param=f"messages[{index}].content[{j}]",
                )
            else:
                out.append(part.text)
        return out

    def text(self, index: int) -> str:
        """The content as text alone (an image is a 400: paths that read text only)."""
        return "".join(p for p in self.parts(index) if isinstance(p, str))


class ChatCompletionRequest(SamplingFields):
    """Body of `POST /v1/chat/completions`. Permissive like every request, but the OpenAI fields no backend
    here honours are declared, so they are refused by name (`unsupported_fields`) instead of ignored."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # OpenAI fields no backend here can honour: refused by name (see `unsupported_fields`).
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    # A reasoning model's thinking (protocol/reasoning.py): OpenAI's effort and vLLM's fields.
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking_token_budget: int | None = Field(None, ge=0)
    include_reasoning: bool = True
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    _bounded_tool_schemas = field_validator("tools")(check_tool_schemas)

    @model_validator(mode="before")
    @classmethod
    def _n_probs(cls, data: Any) -> Any:
        return fold_n_probs(data, ("logprobs", True), ("top_logprobs", ...))

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
        """OpenAI fields sent with a meaning no backend here implements: refused by name, never
        dropped. (A backend refuses what only it cannot do, e.g. a grammar it cannot build.)"""
        refused = []
        if self.functions:
            refused.append("functions")  # deprecated by OpenAI in favour of `tools`
        if self.function_call is not None:
            refused.append("function_call")
        if self.audio is not None or (self.modalities and set(self.modalities) != {"text"}):
            refused.append("audio" if self.audio is not None else "modalities")
        if self.prediction is not None:
            refused.append("prediction")
        if self.web_search_options is not None:
            refused.append("web_search_options")
        if self.store:
            refused.append("store")
        return refused + self.unsupported_extensions()

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequestError("`top_logprobs` needs `logprobs: true`.", param="top_logprobs")
        params = SamplingParams(
            max_tokens=self.max_completion_tokens or self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=self.stop_list(),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            logit_bias=self.logit_bias_ids(),
            json_schema=self.response_format.output_schema() if self.response_format else None,
        )
        return self.apply_extensions(params)

    def thinking(self) -> tuple[bool | None, int | None, dict[str, Any] | None]:
        """The thinking switch, budget and other template kwargs this body asks for."""
        return thinking_control(self.reasoning_effort, self.chat_template_kwargs, self.thinking_token_budget)

    def tools_spec(self) -> ToolsSpec | None:
        return tools_spec(self.tools, self.tool_choice, self.parallel_tool_calls)

    def to_engine_messages(self, see: ImageReader = text_only) -> list[ChatMessage]:
        """The engine's turns; each image goes through `see` (protocol/images.py)."""
        out = []
        for i, m in enumerate(self.messages):
            if m.role == "tool" and not m.tool_call_id:
                raise BadRequestError(
                    "A `tool` message needs `tool_call_id`.", param=f"messages[{i}].tool_call_id"
                )
            calls = [c.to_engine() for c in m.tool_calls] if m.tool_calls else None
            content, parts = turn_content(m.parts(i, see))
            out.append(
                ChatMessage(
                    role=m.role,
                    content=content,
                    parts=parts,
                    name=m.name,
                    tool_calls=calls,
                    tool_call_id=m.tool_call_id,
                )
            )
        return out


class ChatCompletionMessage(NestedOmitsNone):
    """The assistant's reply in a non-streamed choice. `content` is null when the reply is only tool calls, as
    OpenAI sends it."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    # A reasoning model's thinking, under vLLM's two names (the same text); absent otherwise.
    reasoning_content: str | None = None
    reasoning: str | None = None
    # `tool_calls` is absent (not null) when there are none, as in OpenAI's responses.
    omit_when_none: ClassVar[frozenset[str]] = frozenset({"tool_calls", "reasoning_content", "reasoning"})


class ChatCompletionChoice(ResponseModel):
    """One of the `n` samples of a non-streamed chat completion; `logprobs` is set only when the request asked
    for them."""

    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None


class ChatCompletion(ResponseModel):
    """OpenAI's `chat.completion` object, the non-streamed response; `usage` is always present."""

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
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallChunk] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(ResponseModel):
    """One choice's piece of a stream chunk; `finish_reason` is set once, on that choice's last piece."""

    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(ResponseModel):
    """One SSE event of a chat stream. `usage` is left out rather than null, except on the usage-only last
    chunk that `stream_options.include_usage` asks for."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None

    omit_when_none: ClassVar[frozenset[str]] = frozenset({"usage"})
