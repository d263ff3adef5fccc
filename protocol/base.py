"""Base models with deliberate extra-field policies.

Requests are permissive because OpenAI clients add fields all the time and an unknown field must not
break a working client; the server logs each unknown field once. Configuration is strict: a typo in
a config file should fail loudly at start, not silently fall back to a default.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from raygate.protocol.text import check_text, printable


class RequestModel(BaseModel):
    """Base of every request body: unknown fields are kept (see `model_extra`) and reported."""

    model_config = ConfigDict(extra="allow")

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        """No field's text may hold a lone surrogate: it cannot reach a tokenizer (protocol/text.py)."""
        return check_text(value)


class ResponseModel(BaseModel):
    """Base of every response body: we only ever build these ourselves."""

    model_config = ConfigDict(extra="forbid")

    # Optional top-level fields the OpenAI spec omits rather than sending as null.
    omit_when_none: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> str:
        omit = {f for f in self.omit_when_none if getattr(self, f) is None}
        return self.model_dump_json(exclude=omit or None)


class NestedOmitsNone(ResponseModel):
    """A response part that leaves its unset `omit_when_none` fields out (not null) wherever it
    is nested, as OpenAI's and Cohere's answers do; `to_json` does it only at a body's top. Only
    these parts pay for the serializer: the streamed chunks stay plain."""

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self.omit_when_none:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class StrictModel(BaseModel):
    """Base of configuration: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        """Names, paths and environment values must encode: a lone surrogate is refused here."""
        return check_text(value)


def describe_errors(exc: ValidationError, limit: int = 10) -> str:
    """pydantic's errors as `field: message` lines, without the offending values: a config or a
    registry may hold secrets (an `env:` token, say) that must not reach a terminal or a log."""
    lines = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        lines.append(f"  {printable(where)}: {printable(str(err.get('msg', 'invalid value')))}")
    if len(exc.errors()) > limit:
        lines.append(f"  (and {len(exc.errors()) - limit} more)")
    return "\n".join(lines)
