"""`POST /v1/responses`: the request (the response object and what the store keeps are in
`protocol/response_object.py`).

The Responses API describes a conversation as typed *items* rather than chat messages; the request
models here accept OpenAI's input forms (`protocol/response_input.py`) and normalise them to the
items of `protocol/response_items.py`, from which the engine gets ordinary chat turns. The stream
events live in `protocol/response_events.py`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from raygate.protocol.base import RequestModel
from raygate.protocol.errors import BadRequestError, OpenAIError, UnsupportedParameterError
from raygate.protocol.generation import SamplingParams, ToolsSpec
from raygate.protocol.reasoning import thinking_control
from raygate.protocol.response_input import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    MessageInput,
    ReasoningInput,
)
from raygate.protocol.response_items import InputMessageItem, InputTextContent, Item, item_id
from raygate.protocol.tools import (
    FUNCTION_NAME_PATTERN,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    ToolDefinition,
    tools_spec,
)

ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]

MAX_METADATA_PAIRS = 16  # OpenAI's limits on `metadata`
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class ResponseNotFoundError(OpenAIError):
    """404 for a response id that is unknown, expired, deleted, or another API key's (the same
    answer for all four, so ids of other keys cannot be probed)."""

    status_code = 404
    error_type = "invalid_request_error"

    @classmethod
    def for_id(cls, response_id: str, param: str | None = None) -> ResponseNotFoundError:
        what = "Previous response" if param == "previous_response_id" else "Response"
        return cls(f"{what} with id '{response_id}' not found.", param=param)


# -- request --------------------------------------------------------------------------------------


SummaryMode = Literal["auto", "concise", "detailed"]


class ReasoningParam(RequestModel):
    """`reasoning`: `effort` switches a reasoning model's thinking (`none`: off) and bounds it
    (protocol/reasoning.py); `summary` (or its deprecated name `generate_summary`) asks for the
    reasoning item's `summary`, which holds the thinking itself: the three modes are the same here
    (server/serving/response_output.py)."""

    effort: str | None = None
    summary: SummaryMode | None = None
    generate_summary: SummaryMode | None = None

    def mode(self) -> SummaryMode | None:
        return self.summary or self.generate_summary

    def echo(self) -> dict[str, Any]:
        """As the response's `reasoning` shows it."""
        return {"effort": self.effort, "summary": self.mode()}


class ResponsesTool(RequestModel):
    """An entry of `tools`. Only `function` tools can run here; the others (`web_search`,
    `file_search`, `computer_use_preview`, ...) are OpenAI's hosted tools and are refused by name."""

    type: str
    name: str | None = Field(None, pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceObject(RequestModel):
    """`{"type": "function", "name": ...}` forces that function; other object forms are refused."""

    type: str
    name: str | None = None


class TextFormat(RequestModel):
    """`text.format`: `text`, `json_object`, or `json_schema` (flat: name, schema, strict)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    def output_schema(self) -> dict[str, Any] | None:
        if self.type == "json_object":
            return {"type": "object"}
        if self.type == "json_schema":
            if self.name is None or self.schema_ is None:
                raise BadRequestError(
                    "`text.format` of type `json_schema` needs `name` and `schema`.", param="text.format"
                )
            return self.schema_
        return None


class TextConfig(RequestModel):
    """`text`: the output's format (`verbosity` is accepted; there is one verbosity here)."""

    format: TextFormat | None = None
    verbosity: str | None = None


class CreateResponseRequest(RequestModel):
    """The body of `POST /v1/responses`."""

    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=16)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceObject | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    store: bool | None = True
    stream: bool | None = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Fields with a meaning this gateway does not implement: refused by name when they ask for it.
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    include: list[str] | None = None
    reasoning: ReasoningParam | None = None
    truncation: str | None = None
    top_logprobs: int | None = None

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs are allowed")
        for key, item in value.items():
            if len(key) > MAX_METADATA_KEY or len(item) > MAX_METADATA_VALUE:
                raise ValueError(
                    f"keys are at most {MAX_METADATA_KEY} characters, values at most {MAX_METADATA_VALUE}"
                )
        return value

    def unsupported_fields(self) -> list[str]:
        """Fields asking for something no backend here does; refused by name (server/serving/resolve)."""
        refused = []
        if self.background:
            refused.append("background")
        if self.conversation is not None:
            refused.append("conversation")
        if self.prompt is not None:
            refused.append("prompt")
        if self.include:
            refused.append("include")
        if self.truncation not in (None, "disabled"):
            refused.append("truncation")
        if self.top_logprobs:
            refused.append("top_logprobs")
        return refused

    # -- what the engine gets ----------------------------------------------------------------------

    def input_items(self) -> list[Item]:
        """`input` as conversation items, with ids (a string is one user message)."""
        if isinstance(self.input, str):
            text = InputTextContent(text=self.input)
            return [InputMessageItem(id=item_id("msg"), role="user", content=[text])]
        items: list[Item] = []
        for i, entry in enumerate(self.input):
            param = f"input[{i}]"
            if isinstance(entry, MessageInput | FunctionCallOutputInput):
                items.append(entry.to_item(param))
            elif isinstance(entry, FunctionCallInput | ReasoningInput):
                items.append(entry.to_item())
            else:
                raise UnsupportedParameterError(
                    f"Input items of type `{entry.type}` are not supported: send messages, "
                    "`function_call` and `function_call_output` items.",
                    param=param,
                )
        return items

    def wants_summary(self) -> bool:
        """Whether the reasoning item carries a `summary` (`reasoning.summary` set)."""
        return self.reasoning is not None and self.reasoning.mode() is not None

    def thinking(self) -> tuple[bool | None, int | None, dict[str, Any] | None]:
        """The thinking switch, budget and template kwargs `reasoning.effort` asks for."""
        effort = self.reasoning.effort if self.reasoning else None
        return thinking_control(effort, None, None, param="reasoning.effort")

    def format(self) -> TextFormat:
        return self.text.format if self.text and self.text.format else TextFormat(type="text")

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_output_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            json_schema=self.format().output_schema(),
        )

    def function_tools(self) -> list[ResponsesTool]:
        """The function tools; any hosted tool type is a 400 that names every one of them."""
        tools = self.tools or []
        hosted = sorted({t.type for t in tools if t.type != "function"})
        if hosted:
            raise UnsupportedParameterError(
                f"Tools of type {', '.join(f'`{t}`' for t in hosted)} are not supported: Raygate runs "
                "`function` tools only (the client executes them).",
                param="tools",
            )
        for i, tool in enumerate(tools):
            if tool.name is None:
                raise BadRequestError("A `function` tool needs `name`.", param=f"tools[{i}].name")
        return tools

    def tools_spec(self) -> ToolsSpec | None:
        """The same normalisation as chat's `tools` / `tool_choice` (protocol/tools.py)."""
        definitions = [
            ToolDefinition(
                type="function",
                function=FunctionDefinition(
                    name=str(t.name), description=t.description, parameters=t.parameters, strict=t.strict
                ),
            )
            for t in self.function_tools()
        ]
        choice = self.tool_choice
        if isinstance(choice, ToolChoiceObject):
            if choice.type != "function" or choice.name is None:
                raise UnsupportedParameterError(
                    f"`tool_choice` of type `{choice.type}` is not supported: use `none`, `auto`, "
                    '`required` or `{"type": "function", "name": ...}`.',
                    param="tool_choice",
                )
            named = NamedToolChoice(type="function", function=FunctionName(name=choice.name))
            return tools_spec(definitions, named, self.parallel_tool_calls)
        return tools_spec(definitions, choice, self.parallel_tool_calls)
