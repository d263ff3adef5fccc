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
import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from raygate.protocol.errors import (
    BadRequestError,
    ContextLengthExceededError,
    EngineError,
    UnsupportedParameterError,
)
from raygate.protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    RankRequest,
    RankResult,
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


def truncate_prompt(ids: list[int], keep: int | None, context_length: int) -> list[int]:
    """vLLM's `truncate_prompt_tokens`: only the last `keep` prompt tokens (-1: as many as the
    context holds); None keeps the whole prompt."""
    if keep is None:
        return ids
    keep = context_length if keep == -1 else keep
    return ids[-keep:] if len(ids) > keep else ids


def check_token_ids(ids: Iterable[int], vocab: int, param: str) -> None:
    """Refuse ids outside the vocabulary with a 400 naming the request field: an engine library
    would read out of bounds (llama.cpp) or fail deep inside (vLLM) instead."""
    if any(not 0 <= t < vocab for t in ids):
        raise BadRequestError(f"Token ids must be in [0, {vocab}).", param=param)


L = TypeVar("L")


def loaded(handle: L | None) -> L:
    """`handle` (the engine library's object), or the error for a call before `start()` finished."""
    if handle is None:
        raise EngineError("engine is not loaded")
    return handle


@dataclass(slots=True)
class EngineStats:
    """Counters an operator (and the cancellation tests) can read off a replica."""

    running: int = 0
    requests_total: int = 0
    aborted_total: int = 0
    tokens_generated_total: int = 0
    # The prompt cache (llama.cpp engines): requests that reused a cached prefix (hits) or
    # evaluated their whole prompt (misses), and the prompt tokens taken from the cache.
    prompt_cache_hits_total: int = 0
    prompt_cache_misses_total: int = 0
    prompt_cache_reused_tokens_total: int = 0
    # Prompts whose prefix came back from host memory (a slot's state stored when it was evicted).
    prompt_cache_restored_total: int = 0
    # Prompts seen exactly before, whose first token was drawn from the logits kept at their last
    # position then, with no decode (the batched engine).
    prompt_cache_logits_reused_total: int = 0
    # Running sequences whose slot went to a waiting one of a better class (a batch line's, to an
    # interactive request: the batched engine); each resumed later where it stopped.
    preemptions_total: int = 0
    # The llama.cpp engines' forward passes (`llama_decode`): how many, the tokens they carried and
    # the wall time inside them. Against the replica's wall time this splits serving from compute
    # under real load (a pass of 8 sequences slows when other work preempts its threads).
    forward_passes_total: int = 0
    forward_tokens_total: int = 0
    forward_seconds_total: float = 0.0
    # Engine request ids in flight: the gateway prefixes them with the HTTP X-Request-Id.
    running_ids: tuple[str, ...] = ()

    def count_prompt_cache(self, reused: int) -> None:
        """One prompt looked up in the cache; `reused` of its tokens were already evaluated."""
        if reused > 0:
            self.prompt_cache_hits_total += 1
            self.prompt_cache_reused_tokens_total += reused
        else:
            self.prompt_cache_misses_total += 1

    @contextlib.contextmanager
    def forward(self, tokens: int, passes: int = 1) -> Iterator[None]:
        """Count the block as `passes` forward passes over `tokens` tokens, with its time."""
        began = time.perf_counter()
        yield
        self.forward_passes_total += passes
        self.forward_tokens_total += tokens
        self.forward_seconds_total += time.perf_counter() - began


@dataclass(eq=False, slots=True)
class Running:
    """One request inside an engine, from `Engine._running`: its cancel flag (set by `abort()`;
    engines with a decode thread poll it) and whether the engine has produced its last delta."""

    request_id: str
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    ended: bool = False


class Engine(abc.ABC):
    """One loaded model. Instances live inside a Ray replica actor.

    The bookkeeping every engine needs is here, once: the counters (`stats()`), the ids of the
    requests in flight, and `abort()`. An engine wraps each generation in `with
    self._running(request_id) as run:` and sets `run.ended` as its last delta goes out (before the
    `yield`: a consumer may close the stream as soon as it has read it)."""

    def __init__(self, stats: EngineStats | None = None) -> None:
        self._stats = stats if stats is not None else EngineStats()
        self._requests: dict[str, Running] = {}

    @contextlib.contextmanager
    def _running(self, request_id: str) -> Iterator[Running]:
        """Count one generation and make it abortable. It counts as aborted when its consumer
        left (the generator was closed or cancelled) before the engine ended it; an engine error
        is not an abort."""
        run = Running(request_id)
        self._requests[request_id] = run
        self._stats.requests_total += 1
        self._stats.running += 1
        try:
            yield run
        except (GeneratorExit, asyncio.CancelledError):
            if not run.ended:
                self._stats.aborted_total += 1
            raise
        finally:
            self._stats.running -= 1
            if self._requests.get(request_id) is run:
                del self._requests[request_id]

    def stats(self) -> EngineStats:
        """A snapshot of the counters, with the ids in flight."""
        return dataclasses.replace(self._stats, running_ids=tuple(self._requests))

    async def abort(self, request_id: str) -> bool:
        """Stop a running request: sets its cancel flag. Returns whether it was known. Engines
        whose library keeps its own queue extend this to tell the library too."""
        run = self._requests.get(request_id)
        if run is None:
            return False
        run.cancel.set()
        return True

    @abc.abstractmethod
    async def start(self) -> None:
        """Load weights. Raises on a bad path or config so the replica reports `failed`."""

    @abc.abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        """Stream one sequence (see the module docstring for the contract)."""

    @abc.abstractmethod
    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embed a batch; vectors come back unit-normalised."""

    async def rank(self, request: RankRequest) -> RankResult:
        """A cross-encoder's relevance logits, one per pair (`task: rerank`). Embedding models
        need no engine support: the gateway ranks them by cosine similarity of `embed` vectors."""
        raise BadRequestError(f"{type(self).__name__} does not serve rerank.", param="model")

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter that requests then name in `GenerateRequest.lora` (docs/lora.md).
        Raises BadRequestError naming the adapter when the file is not one for this model."""
        raise BadRequestError(f"{type(self).__name__} does not serve LoRA adapters.", param="lora_name")

    async def unload_adapter(self, name: str) -> None:
        """Forget a LoRA adapter: new requests for it are refused; running ones finish with it."""
        raise BadRequestError(f"{type(self).__name__} does not serve LoRA adapters.", param="lora_name")

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
