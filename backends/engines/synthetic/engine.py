"""`backend: synthetic` — a TEST AND BENCHMARK ENGINE. It produces no language.

It exists to measure and fault-test the gateway itself (HTTP, SSE, the Ray hop, routing,
cancellation) without a model's cost in the way: it emits `max_tokens` copies of a fixed piece of
text with a configurable time to first token and per-token delay, and can be told to fail after N
tokens (vLLM's `evil_forward` idea). Never use it to show that a feature works for real users.

Engine kwargs (the `engine:` block of a model config):
    ttft_ms: float = 0        delay before the first token
    token_ms: float = 0       delay between tokens
    default_tokens: int = 128 completion length when the request sets no max_tokens
    text: str = " tok"        the text of every token
    fail_after: int | None    raise an EngineError after this many tokens
    crash_on: str | None      a request whose prompt or messages contain this text kills the
                              replica process before its first token (a poison request, like a
                              grammar that crashes llama.cpp: issue #12)
    context_length: int = 4096
    embedding_dims: int = 8
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from typing import Any

from raygate.backends.engines.base import Engine
from raygate.protocol.embeddings import unit_vector
from raygate.protocol.errors import ContextLengthExceededError, EngineError, UnsupportedParameterError
from raygate.protocol.generation import Delta, EmbedRequest, EmbedResult, GenerateRequest

# The `engine:` keys above; anything else is refused at deploy (backends/engines/options.py).
SYNTHETIC_OPTIONS = frozenset(
    {"ttft_ms", "token_ms", "default_tokens", "text", "fail_after", "crash_on"}
    | {"context_length", "embedding_dims"}
)


class SyntheticEngine(Engine):
    """`backend: synthetic`: fixed text at configured speeds, optionally failing after N tokens, for tests and
    benchmarks only. Unknown options are an error."""

    def __init__(self, engine_kwargs: dict[str, Any]) -> None:
        unknown = set(engine_kwargs) - SYNTHETIC_OPTIONS
        if unknown:
            raise ValueError(f"unknown synthetic engine options: {sorted(unknown)}")
        super().__init__()
        self._ttft = float(engine_kwargs.get("ttft_ms", 0)) / 1000
        self._gap = float(engine_kwargs.get("token_ms", 0)) / 1000
        self._default_tokens = int(engine_kwargs.get("default_tokens", 128))
        self._text = str(engine_kwargs.get("text", " tok"))
        fail_after = engine_kwargs.get("fail_after")
        self._fail_after = None if fail_after is None else int(fail_after)
        crash_on = engine_kwargs.get("crash_on")
        self._crash_on = None if crash_on is None else str(crash_on)
        self._context = int(engine_kwargs.get("context_length", 4096))
        self._dims = int(engine_kwargs.get("embedding_dims", 8))

    async def start(self) -> None:
        return None

    @property
    def context_length(self) -> int:
        return self._context

    async def check_health(self) -> None:
        return None

    async def count_tokens(self, text: str) -> int:
        return len(text.split())

    def _prompt_tokens(self, request: GenerateRequest) -> int:
        if request.messages is not None:
            return sum(len(m.content.split()) + 4 for m in request.messages)
        if isinstance(request.prompt, list):
            return len(request.prompt)
        return len((request.prompt or "").split())

    @staticmethod
    def _prompt_text(request: GenerateRequest) -> str:
        if request.messages is not None:
            return " ".join(m.content for m in request.messages)
        return request.prompt if isinstance(request.prompt, str) else ""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        s = request.sampling
        refused = [
            name
            for name, used in (
                ("logprobs", s.logprobs is not None or s.prompt_logprobs is not None),
                ("logit_bias", bool(s.logit_bias)),
                ("response_format", s.json_schema is not None),
                ("tools", request.tools is not None and request.tools.choice != "none"),
                ("suffix", request.suffix is not None),
            )
            if used
        ]
        if refused:  # it produces no language, so it cannot honour these: refuse, never pretend
            raise UnsupportedParameterError(
                f"`{refused[0]}` is not supported by the synthetic backend.", param=refused[0]
            )
        if self._crash_on is not None and self._crash_on in self._prompt_text(request):
            os._exit(70)  # the whole process, at once, as a segfault in a C library would
        n_prompt = self._prompt_tokens(request)
        budget = request.sampling.max_tokens or self._default_tokens
        if n_prompt + budget > self._context:
            raise ContextLengthExceededError.for_request(
                context_length=self._context,
                prompt_tokens=n_prompt,
                max_tokens=budget,
                param=request.prompt_param,
            )
        with self._running(request.request_id) as run:
            if self._ttft:
                await asyncio.sleep(self._ttft)
            for i in range(1, budget + 1):
                if run.cancel.is_set():
                    break
                if self._fail_after is not None and i > self._fail_after:
                    raise EngineError(f"synthetic engine failure after {self._fail_after} tokens")
                if i > 1 and self._gap:
                    await asyncio.sleep(self._gap)
                self._stats.tokens_generated_total += 1
                run.ended = i == budget
                yield Delta(self._text, i, n_prompt, "length" if i == budget else None)
            run.ended = True

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        vectors = []
        for item in request.inputs:
            digest = hashlib.sha256(repr(item).encode()).digest()
            vectors.append(unit_vector([b - 127.5 for b in digest[: self._dims]]))
        tokens = sum(len(x) if isinstance(x, list) else len(x.split()) for x in request.inputs)
        return EmbedResult(embeddings=vectors, prompt_tokens=tokens)
