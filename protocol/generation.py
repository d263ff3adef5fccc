"""Engine-neutral request and delta types: what crosses the Ray hop between gateway and replica.

They are plain slotted dataclasses rather than pydantic models because one is pickled per token
batch on the hot path; the pydantic request models in `chat.py` / `completions.py` are the wire
format and map onto these with `to_sampling_params()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(slots=True)
class SamplingParams:
    """What an engine needs to decode; `None` means "the engine's OpenAI-compatible default"."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass(slots=True)
class ChatMessage:
    """A text-only chat turn, ready for the model's chat template."""

    role: str
    content: str
    name: str | None = None


@dataclass(slots=True)
class GenerateRequest:
    """One sequence to generate. Exactly one of `prompt` / `messages` is set.

    `prompt` may be text or token ids (the completions API accepts both). `request_id` is the handle
    `abort()` takes.
    """

    request_id: str
    sampling: SamplingParams
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None

    @property
    def prompt_param(self) -> str:
        """The request field a context-length error points at, as OpenAI names it."""
        return "messages" if self.messages is not None else "prompt"


@dataclass(slots=True)
class Delta:
    """A piece of generated text. The last delta of a sequence has `finish_reason` set.

    `prompt_tokens` / `completion_tokens` are the engine's own running counts, so usage is exact
    without re-tokenising anything in the gateway.
    """

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: FinishReason | None = None


@dataclass(slots=True)
class EmbedRequest:
    """A batch to embed: texts, or token-id lists (both are valid OpenAI `input`)."""

    request_id: str
    inputs: list[str] | list[list[int]]


@dataclass(slots=True)
class EmbedResult:
    """Unit-normalised vectors in input order, and the tokens they consumed."""

    embeddings: list[list[float]]
    prompt_tokens: int
