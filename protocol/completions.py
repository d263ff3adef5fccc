"""`POST /v1/completions`: request and response (streamed chunks share the response shape)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import Field, field_validator, model_validator

from raygate.protocol.base import ResponseModel
from raygate.protocol.common import SamplingFields, Usage
from raygate.protocol.extensions import fold_n_probs
from raygate.protocol.generation import FinishReason, SamplingParams
from raygate.protocol.tools import CompletionLogprobs

Prompt = str | list[str] | list[int] | list[list[int]]

# OpenAI's documented default for /v1/completions (chat has no such default).
DEFAULT_COMPLETION_MAX_TOKENS = 16


class CompletionRequest(SamplingFields):
    """Body of the legacy `POST /v1/completions`: text or token-id prompts, one or a batch. `max_tokens`
    defaults to OpenAI's 16; `best_of` above `n` is refused."""

    prompt: Prompt
    max_tokens: int | None = Field(DEFAULT_COMPLETION_MAX_TOKENS, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _n_probs(cls, data: Any) -> Any:
        return fold_n_probs(data, ("logprobs", ...))

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: Prompt) -> Prompt:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        if isinstance(value, list) and any(isinstance(p, list) and not p for p in value):
            raise ValueError("token-id prompts must not be empty")
        return value

    def prompts(self) -> list[str] | list[list[int]]:
        """Normalise the four OpenAI prompt forms to a list of prompts, one per choice group."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [cast(list[int], p)]
        return cast(list[str] | list[list[int]], list(p))

    def unsupported_fields(self) -> list[str]:
        """`best_of` > `n` means "sample more, return the best": no backend here ranks samples."""
        refused = ["best_of"] if self.best_of not in (None, 1, self.n) else []
        return refused + self.unsupported_extensions()

    def to_sampling_params(self) -> SamplingParams:
        params = SamplingParams(
            max_tokens=self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=self.stop_list(),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo else None,
            logit_bias=self.logit_bias_ids(),
        )
        return self.apply_extensions(params)


class CompletionChoice(ResponseModel):
    """One sample of one prompt. Choices run prompt by prompt, `n` each (index = prompt * n + sample); an
    echoed prompt is part of `text`."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class Completion(ResponseModel):
    """A `text_completion`: the whole response and each stream chunk alike, as in OpenAI's API; `usage` is
    left out rather than null when absent."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None

    omit_when_none: ClassVar[frozenset[str]] = frozenset({"usage"})
