"""Shapes shared by several endpoints: usage, stream options, and sampling field bounds."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from raygate.protocol.base import NestedOmitsNone, RequestModel, ResponseModel
from raygate.protocol.extensions import SamplingExtensions

MAX_STOP_SEQUENCES = 4
MAX_LOGIT_BIAS = 300  # OpenAI's limit on the number of biased tokens


class PromptTokensDetails(ResponseModel):
    """The prompt tokens an engine's prompt cache already held (OpenAI's and vLLM's field)."""

    cached_tokens: int = 0


class CompletionTokensDetails(ResponseModel):
    """The completion tokens a reasoning model spent thinking (OpenAI's field)."""

    reasoning_tokens: int = 0


class Usage(NestedOmitsNone):
    """OpenAI's `usage`: the engines' own token counts, never re-tokenised in the gateway. Build it with
    `of()`, which keeps `total_tokens` the sum of the other two. `prompt_tokens_details` only
    when the engine counts cached tokens (the llama.cpp engines do), as vLLM leaves it out."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    # Only for a reasoning model (its engine counts thinking tokens).
    completion_tokens_details: CompletionTokensDetails | None = None
    omit_when_none: ClassVar[frozenset[str]] = frozenset(
        {"prompt_tokens_details", "completion_tokens_details"}
    )

    @property
    def cached_tokens(self) -> int:
        return 0 if self.prompt_tokens_details is None else self.prompt_tokens_details.cached_tokens

    @classmethod
    def of(
        cls,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> Usage:
        return cls(
            completion_tokens_details=None
            if reasoning_tokens is None
            else CompletionTokensDetails(reasoning_tokens=reasoning_tokens),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=None
            if cached_tokens is None
            else PromptTokensDetails(cached_tokens=cached_tokens),
        )


class StreamOptions(RequestModel):
    """OpenAI's `stream_options`: with `include_usage` a stream ends with one extra chunk whose `choices` is
    empty and which carries the usage."""

    include_usage: bool = False


class LoraChoice(RequestModel):
    """One LoRA adapter of a request's `lora` list (llama-server's shape): `id`, its position in
    `GET /lora-adapters` for the model, or `name`, and the scale it applies at."""

    id: int | None = Field(None, ge=0, le=1_000_000)
    name: str | None = Field(None, min_length=1, max_length=256)
    scale: float = Field(1.0, ge=-100, le=100, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_reference(self) -> LoraChoice:
        if (self.id is None) == (self.name is None):
            raise ValueError("each `lora` entry names its adapter by `id` or by `name` (one of them)")
        return self


class SamplingFields(SamplingExtensions):
    """Fields with the same meaning and bounds on chat and completions (OpenAI's documented ranges;
    vLLM's extensions come with the base)."""

    model: str = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's: admission order in the gateway (lower first); see server/serving/admission.py.
    priority: int | None = Field(None, ge=-(2**31), le=2**31 - 1)
    # llama-server's: the LoRA adapters of the model to decode under, each with its scale; it
    # replaces the adapter a `model: <adapter>` names. `[]`: the base model alone (docs/lora.md).
    lora: list[LoraChoice] | None = Field(None, max_length=16)

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        """Keys are token ids as strings (JSON object keys); values on OpenAI's -100..100 scale."""
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens may be biased")
        for key, bias in value.items():
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"keys must be token ids, got {key[:20]!r}")
            if not -100 <= bias <= 100:
                raise ValueError("biases must be between -100 and 100")
        return value

    def logit_bias_ids(self) -> dict[int, float] | None:
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):
            if len(value) > MAX_STOP_SEQUENCES:
                raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
            if any(not s for s in value):
                raise ValueError("stop sequences must be non-empty strings")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        if isinstance(self.stop, str):
            return [self.stop] if self.stop else []
        return list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)
