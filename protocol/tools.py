"""Wire shapes for function tools, structured output and log-probabilities (chat and completions).

They live apart from `chat.py` because several of them are shared: completions report logprobs
too, and the tool-call shapes appear in requests (earlier turns), responses and stream chunks.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from raygate.protocol.base import RequestModel, ResponseModel
from raygate.protocol.generation import FunctionTool, TokenLogprob, ToolCall, ToolsSpec, TopLogprob
from raygate.protocol.schema_limits import SchemaCost, check_schema, check_total, schema_cost

# OpenAI's documented limits for function names and the number of tools.
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_TOOLS = 128
# OpenAI's value for "far outside the top alternatives"; JSON has no -Infinity.
MIN_LOGPROB = -9999.0


# -- requests -------------------------------------------------------------------------------------


class FunctionDefinition(RequestModel):
    """A function the client offers the model (`tools[].function`). The name must match OpenAI's pattern;
    `parameters` is its arguments' JSON schema."""

    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _bounded_schema = field_validator("parameters")(check_schema)


class ToolDefinition(RequestModel):
    """One entry of a request's `tools`; `function` is the only tool type the chat API defines."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(RequestModel):
    """The `function` of a named `tool_choice`; it must name an offered tool (checked in `tools_spec`)."""

    name: str


class NamedToolChoice(RequestModel):
    """A `tool_choice` that forces one function: the output is constrained so that the call is made, not
    merely asked for."""

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def check_tool_schemas(tools: list[ToolDefinition] | None) -> list[ToolDefinition] | None:
    """The per-request schema bounds over every tool's parameters (each was checked alone)."""
    if tools:
        total = SchemaCost()
        for tool in tools:
            if tool.function.parameters is not None:
                total = total + schema_cost(tool.function.parameters)
        check_total(total)
    return tools


def tools_spec(
    tools: list[ToolDefinition] | None, choice: ToolChoice | None, parallel: bool | None
) -> ToolsSpec | None:
    """Normalise `tools` / `tool_choice`; a choice that names nothing offered is a 400."""
    from raygate.protocol.errors import BadRequestError

    if not tools:
        if choice is not None and choice != "none":
            raise BadRequestError("`tool_choice` needs `tools`.", param="tool_choice")
        return None
    functions = [FunctionTool(t.function.name, t.function.description, t.function.parameters) for t in tools]
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise BadRequestError("Tool function names must be unique.", param="tools")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise BadRequestError(
                f"`tool_choice` names `{choice.function.name}`, which is not in `tools`.",
                param="tool_choice",
            )
        return ToolsSpec(functions, "function", choice.function.name, parallel is not False)
    return ToolsSpec(functions, choice or "auto", None, parallel is not False)


class JsonSchemaFormat(RequestModel):
    """`response_format.json_schema`. The schema arrives as `schema`, aliased because the name would shadow a
    pydantic attribute; it constrains decoding."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    _bounded_schema = field_validator("schema_")(check_schema)


class ResponseFormat(RequestModel):
    """OpenAI's `response_format`: free `text`, any `json_object`, or `json_schema`; both JSON kinds constrain
    decoding through `SamplingParams.json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    # `{"type": "json_object", "schema": {...}}`: llama-cpp-python's and Together's extension (what
    # instructor's JSON_SCHEMA mode sends): the object must also match this schema.
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("`json_schema` is required when type is `json_schema`")
        return self

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the output must satisfy, or None for free text."""
        if self.type == "json_object":
            return self.schema_ or {"type": "object"}
        if self.type == "json_schema" and self.json_schema is not None:
            return self.json_schema.schema_ or {}
        return None


class FunctionCallIn(RequestModel):
    """The function of a call from an earlier assistant turn. `arguments` is JSON text, as OpenAI defines it;
    an object is accepted too and turned into text."""

    name: str
    arguments: str | dict[str, Any] = ""

    @field_validator("arguments")
    @classmethod
    def _as_text(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        return value if isinstance(value, str) else json.dumps(value)


class ToolCallIn(RequestModel):
    """A tool call in an assistant message sent back as history; it becomes the engine's `ToolCall` for the
    chat template."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn

    def to_engine(self) -> ToolCall:
        return ToolCall(self.id, self.function.name, str(self.function.arguments))


# -- responses ------------------------------------------------------------------------------------


class FunctionCallOut(ResponseModel):
    """The function a returned tool call invokes; `arguments` is JSON text, as OpenAI sends it."""

    name: str
    arguments: str


class ToolCallOut(ResponseModel):
    """A complete tool call in a non-streamed chat response (`message.tool_calls`)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class FunctionCallChunk(ResponseModel):
    """The function part of a streamed tool-call piece: `name` on the first piece only, then `arguments`
    appended piece by piece; absent keys are left out, not null."""

    name: str | None = None
    arguments: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ToolCallChunk(ResponseModel):
    """A streamed piece of a call: `index` is on every piece (clients key on it)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallChunk | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


def _clamp(logprob: float | None) -> float:
    return MIN_LOGPROB if logprob is None else max(float(logprob), MIN_LOGPROB)


class TopLogprobOut(ResponseModel):
    """One alternative token in chat logprobs. `bytes` are raw (a token may be half a UTF-8 character); a
    logprob is clamped to -9999, as JSON has no -Infinity."""

    token: str
    logprob: float
    bytes: list[int] | None

    @classmethod
    def of(cls, top: TopLogprob) -> TopLogprobOut:
        return cls(token=top.token, logprob=_clamp(top.logprob), bytes=list(top.token_bytes))


class TokenLogprobOut(ResponseModel):
    """One generated token in chat logprobs, with its `top_logprobs` alternatives (OpenAI's
    `ChatCompletionTokenLogprob`)."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprobOut]

    @classmethod
    def of(cls, lp: TokenLogprob) -> TokenLogprobOut:
        return cls(
            token=lp.token,
            logprob=_clamp(lp.logprob),
            bytes=list(lp.token_bytes),
            top_logprobs=[TopLogprobOut.of(t) for t in lp.top],
        )


class ChoiceLogprobs(ResponseModel):
    """Chat format: one entry per generated token."""

    content: list[TokenLogprobOut] | None
    refusal: list[TokenLogprobOut] | None = None

    @classmethod
    def of(cls, entries: list[TokenLogprob]) -> ChoiceLogprobs:
        return cls(content=[TokenLogprobOut.of(e) for e in entries])


class CompletionLogprobs(ResponseModel):
    """Legacy completions format: parallel lists; `text_offset` counts characters into `text`."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]

    @classmethod
    def of(cls, entries: list[TokenLogprob], start: int) -> CompletionLogprobs:
        """An echoed first prompt token has no logprob (None), as in OpenAI's API."""
        offsets, at = [], start
        for e in entries:
            offsets.append(at)
            at += len(e.token)
        return cls(
            tokens=[e.token for e in entries],
            token_logprobs=[None if e.logprob is None else _clamp(e.logprob) for e in entries],
            top_logprobs=[
                None
                if e.logprob is None
                # The sampled token is listed too, as OpenAI's legacy API does.
                else {t.token: _clamp(t.logprob) for t in e.top} | {e.token: _clamp(e.logprob)}
                for e in entries
            ],
            text_offset=offsets,
        )
