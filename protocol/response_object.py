"""`POST /v1/responses`: the response object as the API returns it, and what the store keeps.

Split from `protocol/responses.py` (the request side) so each module holds one direction of the wire.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_serializer

from raygate.protocol.base import NestedOmitsNone, ResponseModel
from raygate.protocol.response_items import ConversationItem, Item, OutputItem
from raygate.protocol.responses import ResponseStatus, ResponsesTool, TextFormat


class FunctionToolOut(ResponseModel):
    """A function tool as the response echoes it."""

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None
    strict: bool | None

    @classmethod
    def of(cls, tool: ResponsesTool) -> FunctionToolOut:
        return cls(
            name=str(tool.name), description=tool.description, parameters=tool.parameters, strict=tool.strict
        )


class ToolChoiceFunctionOut(ResponseModel):
    """A forced function, as the response echoes `tool_choice`."""

    type: Literal["function"] = "function"
    name: str


class TextFormatOut(ResponseModel):
    """`text.format` as the response echoes it."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, serialization_alias="schema")
    strict: bool | None = None

    @classmethod
    def of(cls, fmt: TextFormat) -> TextFormatOut:
        return cls(
            type=fmt.type, name=fmt.name, description=fmt.description, schema_=fmt.schema_, strict=fmt.strict
        )

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if "schema_" in data:  # handler output uses field names unless dumped by alias
            data["schema"] = data.pop("schema_")
        return {k: v for k, v in data.items() if v is not None}


class TextConfigOut(ResponseModel):
    """The response's `text`."""

    format: TextFormatOut


class IncompleteDetails(ResponseModel):
    """Why a response stopped early."""

    reason: Literal["max_output_tokens", "content_filter"] | None = None


class ResponseErrorOut(ResponseModel):
    """A failed response's `error`."""

    code: str
    message: str


class InputTokensDetails(ResponseModel):
    """`cached_tokens`: the input tokens the engine's prompt cache held (0 where it does not count
    them). Nothing is written to a cache on request: `cache_write_tokens` stays 0."""

    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(ResponseModel):
    """The output tokens a reasoning model spent thinking."""

    reasoning_tokens: int = 0


class ResponseUsage(ResponseModel):
    """Token counts, from the engine's own counts."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(
        cls, input_tokens: int, output_tokens: int, cached_tokens: int = 0, reasoning_tokens: int = 0
    ) -> ResponseUsage:
        total = input_tokens + output_tokens
        details = InputTokensDetails(cached_tokens=cached_tokens)
        return cls(
            input_tokens=input_tokens,
            input_tokens_details=details,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
            output_tokens=output_tokens,
            total_tokens=total,
        )


class ResponseObject(NestedOmitsNone):
    """The response object: returned, streamed in lifecycle events, and stored."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    completed_at: int | None = None
    error: ResponseErrorOut | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any] | None = None
    store: bool
    temperature: float
    text: TextConfigOut
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunctionOut
    tools: list[FunctionToolOut]
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    background: bool = False
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str]

    # Typed as plain strings (not nullable) in OpenAI's spec: absent rather than null.
    # Left out wherever the object is serialised, inside stream events too.
    omit_when_none: ClassVar[frozenset[str]] = frozenset({"usage", "user"})


class StoredResponse(ResponseModel):
    """What the store keeps per response: the object, its own input items (`input_items`), and the
    conversation before them (`context`), so `previous_response_id` continues it in one read even
    after older responses of the chain have expired or been deleted."""

    response: ResponseObject
    input: list[ConversationItem]
    context: list[ConversationItem]

    def conversation(self) -> list[Item]:
        """The whole conversation up to and including this response's output, for the next turn."""
        return [*self.context, *self.input, *self.response.output]


class DeletedResponse(ResponseModel):
    """The answer to `DELETE /v1/responses/{id}`."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class ResponseItemList(ResponseModel):
    """A page of `GET /v1/responses/{id}/input_items`."""

    object: Literal["list"] = "list"
    data: list[ConversationItem]
    has_more: bool
    first_id: str
    last_id: str
