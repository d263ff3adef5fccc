"""`POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages API): request models,
and their translation into the engine-neutral types chat completions use.

There is one generation path: a Messages request becomes the same `ChatMessage`s, `ToolsSpec` and
`SamplingParams` a chat completion does, so templates, tool grammars and stop strings behave the
same on both APIs. What Anthropic spells differently is mapped here, once:

- `system` (a string or text blocks) is the first, system turn;
- a `tool_use` block in an assistant turn is an earlier tool call; a `tool_result` block in a user
  turn is a `tool` message answering it;
- `tool_choice` `any` is OpenAI's `required`, `tool` is a named function, and
  `disable_parallel_tool_use` is `parallel_tool_calls: false`.

An `image` block (`source` `base64` with its `media_type`, or `url`) in a user turn is an image for
a vision model (protocol/images.py); a `document` block is a 400 that says so, never dropped.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from raygate.protocol.base import RequestModel
from raygate.protocol.errors import BadRequestError, UnsupportedParameterError
from raygate.protocol.generation import (
    ChatMessage,
    FunctionTool,
    ImageInput,
    SamplingParams,
    ToolCall,
    ToolsSpec,
)
from raygate.protocol.images import ImageReader, ImageRef, text_only, turn_content
from raygate.protocol.tools import FUNCTION_NAME_PATTERN

# -- content blocks ------------------------------------------------------------------------------


class TextBlockIn(RequestModel):
    """A `text` content block of a message (or of `system`)."""

    type: Literal["text"]
    text: str


class Base64ImageSource(RequestModel):
    """An image sent inline: its bytes in base64 and their media type."""

    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class UrlImageSource(RequestModel):
    """An image by URL, fetched by the gateway only when the operator allows its host."""

    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlockIn(RequestModel):
    """An `image` block: read by a vision model (docs/vision.md), a 400 naming the model otherwise."""

    type: Literal["image"]
    source: Annotated[Base64ImageSource | UrlImageSource, Field(discriminator="type")]

    def image_ref(self, where: str) -> ImageRef:
        if isinstance(self.source, Base64ImageSource):
            return ImageRef(f"data:{self.source.media_type};base64,{self.source.data}", f"{where}.source")
        return ImageRef(self.source.url, f"{where}.source.url")


class DocumentBlockIn(RequestModel):
    """A PDF or text document: refused like images (it needs a document pipeline)."""

    type: Literal["document"]
    source: dict[str, Any] | None = None


class ThinkingBlockIn(RequestModel):
    """Extended thinking from an earlier turn, sent back by agents: its signature is checked
    (server/serving/thinking_signature.py), and, as Anthropic does, it is not shown to the model
    again."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None
    signature: str | None = None


class ThinkingParam(RequestModel):
    """`thinking`: `enabled` (with `budget_tokens`, the thinking budget the engine enforces) or
    `adaptive` turn a reasoning model's thinking on, `disabled` off; left out, it is off, as in
    Anthropic's API. Anthropic asks for a budget of 1024 or more; small models here may use less."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)


class ToolUseBlockIn(RequestModel):
    """An assistant turn's earlier tool call, replayed in the conversation (an OpenAI `tool_calls` entry)."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


ToolResultContent = Annotated[TextBlockIn | ImageBlockIn | DocumentBlockIn, Field(discriminator="type")]


class ToolResultBlockIn(RequestModel):
    """The result of a tool call, sent in a user turn; becomes a `tool` message for the chat template."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ToolResultContent] | None = None
    is_error: bool | None = None

    def text(self, where: str) -> str:
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(_text_of(b, f"{where}.content[{j}]") for j, b in enumerate(self.content))
        # The model reads the outcome as text; a failed tool says so in words.
        return f"Error: {text}" if self.is_error else text


ContentBlockIn = Annotated[
    TextBlockIn | ImageBlockIn | DocumentBlockIn | ThinkingBlockIn | ToolUseBlockIn | ToolResultBlockIn,
    Field(discriminator="type"),
]


def _text_of(block: TextBlockIn | ImageBlockIn | DocumentBlockIn, where: str) -> str:
    if isinstance(block, TextBlockIn):
        return block.text
    raise BadRequestError(
        f"Content blocks of type `{block.type}` are not supported here (text blocks, and `image` "
        "blocks in user turns to a vision model).",
        param=where,
    )


class MessageIn(RequestModel):
    """One turn of `messages`: a role and a string or a list of content blocks."""

    role: Literal["user", "assistant"]
    content: str | list[ContentBlockIn]

    def to_engine(self, index: int, see: ImageReader = text_only) -> list[ChatMessage]:
        """One turn, or several: tool results become `tool` messages ahead of the user's text, in
        the order the blocks came (Anthropic puts results first). Images go through `see`."""
        if isinstance(self.content, str):
            return [ChatMessage(self.role, self.content)]
        where = f"messages[{index}].content"
        out: list[ChatMessage] = []
        texts: list[str | ImageInput] = []
        calls: list[ToolCall] = []
        for j, block in enumerate(self.content):
            if isinstance(block, ThinkingBlockIn):
                continue
            if isinstance(block, ToolUseBlockIn):
                if self.role != "assistant":
                    raise BadRequestError("`tool_use` blocks belong in assistant turns.", param=where)
                calls.append(ToolCall(block.id, block.name, json.dumps(block.input)))
            elif isinstance(block, ToolResultBlockIn):
                if self.role != "user":
                    raise BadRequestError("`tool_result` blocks belong in user turns.", param=where)
                if texts:  # text before a result keeps its place in the conversation
                    out.append(_turn("user", texts))
                    texts = []
                out.append(ChatMessage("tool", block.text(f"{where}[{j}]"), tool_call_id=block.tool_use_id))
            elif isinstance(block, ImageBlockIn) and self.role == "user":
                texts.append(see(block.image_ref(f"{where}[{j}]")))
            else:
                texts.append(_text_of(block, f"{where}[{j}]"))
        if calls:
            content, _ = turn_content(texts)
            return [ChatMessage("assistant", content, tool_calls=calls)]
        if texts or not out:
            out.append(_turn(self.role, texts))
        return out


def _turn(role: str, parts: list[str | ImageInput]) -> ChatMessage:
    content, with_images = turn_content(parts)
    return ChatMessage(role, content, parts=with_images)


# -- tools ----------------------------------------------------------------------------------------


class ToolIn(RequestModel):
    """A client tool. Anthropic's server tools (`web_search_…`, `bash_…`) carry a versioned `type`
    and no `input_schema`: nothing here runs them, so they are refused by name."""

    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None

    def to_engine(self, index: int) -> FunctionTool:
        if self.type not in (None, "custom") or self.input_schema is None:
            raise BadRequestError(
                f"Tool `{self.name}`: only client tools with an `input_schema` are supported "
                f"(server tools such as `{self.type or 'web_search'}` are not).",
                param=f"tools[{index}]",
            )
        return FunctionTool(self.name, self.description, self.input_schema)


class _ToolChoiceBase(RequestModel):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAuto(_ToolChoiceBase):
    """The model decides whether to call a tool (OpenAI `auto`)."""

    type: Literal["auto"]


class ToolChoiceAny(_ToolChoiceBase):
    """Some tool must be called (OpenAI `required`): grammar-constrained from the first token."""

    type: Literal["any"]


class ToolChoiceTool(_ToolChoiceBase):
    """This named tool must be called (OpenAI named `tool_choice`)."""

    type: Literal["tool"]
    name: str = Field(min_length=1)


class ToolChoiceNone(RequestModel):
    """Tools are described but never called (OpenAI `none`)."""

    type: Literal["none"]


ToolChoiceIn = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


# -- requests -------------------------------------------------------------------------------------


class MessagesInput(RequestModel):
    """What a create and a count_tokens share: everything that becomes the prompt."""

    model: str = Field(min_length=1)
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlockIn] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingParam | None = None
    mcp_servers: list[Any] | None = None

    def unsupported_fields(self) -> list[str]:
        """Anthropic fields with a meaning no backend here implements: refused by name."""
        refused = []
        if self.mcp_servers:
            refused.append("mcp_servers")
        return refused

    def to_engine_messages(self, see: ImageReader = text_only) -> list[ChatMessage]:
        """The engine's turns; each image goes through `see` (protocol/images.py)."""
        out: list[ChatMessage] = []
        if self.system is not None:
            text = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system)
            out.append(ChatMessage("system", text))
        for i, m in enumerate(self.messages):
            out += m.to_engine(i, see)
        return out

    def thinking_switch(self) -> tuple[bool, int | None]:
        """(on, budget): thinking is on only when asked for, as in Anthropic's API."""
        if self.thinking is None or self.thinking.type == "disabled":
            return False, None
        return True, self.thinking.budget_tokens

    def thinking_blocks(self) -> list[tuple[str, ThinkingBlockIn]]:
        """The `thinking` blocks sent back in assistant turns, with where each is (for errors)."""
        out = []
        for i, m in enumerate(self.messages):
            if isinstance(m.content, str):
                continue
            for j, block in enumerate(m.content):
                if isinstance(block, ThinkingBlockIn) and block.type == "thinking":
                    out.append((f"messages[{i}].content[{j}]", block))
        return out

    def tools_spec(self) -> ToolsSpec | None:
        """The same normalised spec chat builds, so a forced choice gets the same grammar."""
        choice = self.tool_choice
        if not self.tools:
            if choice is not None and choice.type != "none":
                raise BadRequestError("`tool_choice` needs `tools`.", param="tool_choice")
            return None
        functions = [t.to_engine(i) for i, t in enumerate(self.tools)]
        names = [f.name for f in functions]
        if len(set(names)) != len(names):
            raise BadRequestError("Tool names must be unique.", param="tools")
        parallel = not (isinstance(choice, _ToolChoiceBase) and choice.disable_parallel_tool_use)
        if choice is None or isinstance(choice, ToolChoiceAuto):
            return ToolsSpec(functions, "auto", None, parallel)
        if isinstance(choice, ToolChoiceAny):
            return ToolsSpec(functions, "required", None, parallel)
        if isinstance(choice, ToolChoiceNone):
            return ToolsSpec(functions, "none", None, parallel)
        if choice.name not in names:
            raise BadRequestError(
                f"`tool_choice` names `{choice.name}`, which is not in `tools`.", param="tool_choice"
            )
        return ToolsSpec(functions, "function", choice.name, parallel)


class MessagesMetadata(RequestModel):
    """Anthropic's request metadata (`user_id`): accepted and logged, no effect on generation."""

    user_id: str | None = None


class JsonOutputFormat(RequestModel):
    """Structured outputs: the text must be JSON that validates against `schema`."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(RequestModel):
    """`output_config`: `format` constrains the answer to a JSON schema like chat's `response_format`."""

    format: JsonOutputFormat | None = None
    effort: str | None = None


class MessagesRequest(MessagesInput):
    """`POST /v1/messages`. `max_tokens` is required, as in Anthropic's API: a missing one is a 400."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: MessagesMetadata | None = None
    stream: bool = False
    output_config: OutputConfig | None = None
    output_format: JsonOutputFormat | None = None  # the structured-outputs beta's spelling

    def unsupported_fields(self) -> list[str]:
        refused = super().unsupported_fields()
        if self.output_config is not None and self.output_config.effort is not None:
            refused.append("output_config.effort")  # as chat refuses `reasoning_effort`
        return refused

    def to_sampling_params(self) -> SamplingParams:
        """`top_k` 0 is off, as unset (the engines' convention); an output format is the same
        schema constraint as chat's `response_format: json_schema`."""
        on, budget = self.thinking_switch()
        if on and budget is not None and budget >= self.max_tokens:
            raise BadRequestError(
                "`thinking.budget_tokens` must be less than `max_tokens`.", param="thinking.budget_tokens"
            )
        fmt = self.output_format or (self.output_config.format if self.output_config else None)
        if fmt is not None and self.tools and not isinstance(self.tool_choice, ToolChoiceNone):
            raise UnsupportedParameterError(
                "An output format together with `tools` is not supported (one constraint per "
                'request: drop one, or send `tool_choice: {"type": "none"}`).',
                param="output_config",
            )
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k,
            stop=list(self.stop_sequences or ()),
            json_schema=fmt.schema_ if fmt is not None else None,
        )


class CountTokensRequest(MessagesInput):
    """`POST /v1/messages/count_tokens`: the prompt fields of a create, nothing to sample."""
