"""The engine seam: what every backend (llama.cpp today, vLLM next) implements.

Yield/cancel contract of `generate()`:

* It is an async generator of `Delta`s for one sequence. Validation that needs the tokenizer
  (e.g. the context-length check) raises *before the first yield*, so the gateway can still answer
  with a real HTTP status.
* The last delta has `finish_reason` set and carries the final token counts; nothing follows it.
* Closing the generator early (`aclose()`, or a `CancelledError` thrown into it because the client
  went away) stops decoding within one token and frees the engine for the next request: cleanup
  lives in the generator's `finally`, as in vLLM's `AsyncLLM.generate`.
* `abort(request_id)` does the same from outside, for callers that no longer hold the generator.
* Errors after the first yield are raised from the generator as `OpenAIError` subclasses.

Engines never block the event loop: blocking libraries run in their own thread.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass

from protocol.errors import ContextLengthExceededError, UnsupportedParameterError
from protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    TokenizeRequest,
    TokenizeResult,
)


def completion_budget(request: GenerateRequest, n_prompt: int, context_length: int) -> int:
    """Tokens the completion may use: `max_tokens`, or the rest of the context when unset.
    Refused before the engine sees a prompt that cannot fit (OpenAI's error and wording)."""
    wanted = request.sampling.max_tokens
    if wanted is None:
        if n_prompt < context_length:
            return context_length - n_prompt
        wanted = 1
    if n_prompt + wanted > context_length:
        raise ContextLengthExceededError.for_request(
            context_length=context_length,
            prompt_tokens=n_prompt,
            max_tokens=wanted,
            param=request.prompt_param,
        )
    return wanted


@dataclass(slots=True)
class EngineStats:
    """Counters an operator (and the cancellation tests) can read off a replica."""

    running: int = 0
    requests_total: int = 0
    aborted_total: int = 0
    tokens_generated_total: int = 0
    # Engine request ids in flight: the gateway prefixes them with the HTTP X-Request-Id.
    running_ids: tuple[str, ...] = ()


class Engine(abc.ABC):
    """One loaded model. Instances live inside a Ray replica actor."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load weights. Raises on a bad path or config so the replica reports `failed`."""

    @abc.abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        """Stream one sequence (see the module docstring for the contract)."""

    @abc.abstractmethod
    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embed a batch; vectors come back unit-normalised."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Stop a running or queued request. Returns whether it was known."""

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        """vLLM's `/tokenize`: the ids (and their texts) the model would see for a prompt or chat."""
        raise UnsupportedParameterError(
            f"Tokenization is not available for {type(self).__name__}.", param="model"
        )

    async def detokenize(self, tokens: list[int]) -> str:
        """vLLM's `/detokenize`: the text of token ids."""
        raise UnsupportedParameterError(
            f"Detokenization is not available for {type(self).__name__}.", param="model"
        )

    @abc.abstractmethod
    async def count_tokens(self, text: str) -> int:
        """Tokens the model's tokenizer makes of `text` (no special tokens added)."""

    @property
    @abc.abstractmethod
    def context_length(self) -> int:
        """Prompt + completion tokens one sequence may hold."""

    @abc.abstractmethod
    async def check_health(self) -> None:
        """Raise if the engine can no longer serve."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """A snapshot of the counters."""
