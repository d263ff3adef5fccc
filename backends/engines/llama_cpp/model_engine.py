"""What both llama.cpp engines answer from the model's prompt side alone (`LlamaModel`): health,
token counts, tokenize and detokenize. Written once here; the engines differ only in decoding."""

from __future__ import annotations

import asyncio
from typing import Any

from raygate.backends.engines.base import Engine, loaded
from raygate.backends.engines.llama_cpp.model import LlamaModel
from raygate.protocol.generation import TokenizeRequest, TokenizeResult


class LlamaModelEngine(Engine):
    """An engine holding a `LlamaModel` (set by `start()`); subclasses add the decoding."""

    _model: LlamaModel | None

    @property
    def _llm(self) -> Any:
        """The `Llama` object (tokenizer, vocabulary), None before `start()`; tests read it."""
        return None if self._model is None else self._model.llm

    async def check_health(self) -> None:
        loaded(self._model)

    async def count_tokens(self, text: str) -> int:
        return await loaded(self._model).count_tokens(text)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        model = loaded(self._model)
        return await asyncio.to_thread(model.tokenize, request, self.context_length)

    async def detokenize(self, tokens: list[int]) -> str:
        return await loaded(self._model).detokenize(tokens)
