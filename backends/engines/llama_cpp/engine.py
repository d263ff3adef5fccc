"""llama.cpp (via llama-cpp-python) behind the engine seam.

A `Llama` instance is not re-entrant: two decodes at once abort the process. Every call that touches
the context therefore runs on one dedicated thread (a single-worker executor), which also keeps the
blocking C calls off the actor's event loop. Tokens travel back to the loop through an asyncio
queue; a per-request cancel flag is checked after every token, so an abort costs at most one more
token of work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from backends.engines.llama_cpp import sampling as sampling_lib
from backends.engines import tool_calls
from backends.engines.base import Engine, EngineStats, completion_budget
from backends.engines.llama_cpp.sequence import SequenceOutput
from protocol.errors import (
    BadRequestError,
    ContextLengthExceededError,
    EngineError,
    UnsupportedParameterError,
)
from protocol.generation import (
    ChatMessage,
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    TokenizeRequest,
    TokenizeResult,
    ToolsSpec,
)

# Defaults chosen for a shared CPU box: one thread per replica keeps generation steady when other
# replicas run (with 2 threads it collapses 5-8x under contention, measured on 2 cores).
DEFAULT_ENGINE_KWARGS: dict[str, Any] = {"n_ctx": 2048, "n_threads": 1, "n_threads_batch": 1}

_DONE = object()


class LlamaCppEngine(Engine):
    def __init__(self, model_path: str, *, embedding: bool, engine_kwargs: dict[str, Any]) -> None:
        self._model_path = model_path
        self._embedding = embedding
        self._kwargs = {**DEFAULT_ENGINE_KWARGS, **engine_kwargs, "verbose": False}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-cpp")
        self._llm: Any = None
        self._formatter: Any = None
        self._cancel_flags: dict[str, threading.Event] = {}
        self._stats = EngineStats()

    async def start(self) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        loop = asyncio.get_running_loop()
        self._llm = await loop.run_in_executor(
            self._executor,
            lambda: Llama(model_path=self._model_path, embedding=self._embedding, **self._kwargs),
        )
        if self._embedding:
            import llama_cpp

            if self._llm.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_NONE:
                raise EngineError(f"{self._model_path} has no pooling layer; it cannot embed text")
            return
        template = self._llm.metadata.get("tokenizer.chat_template")
        if template:
            model = self._llm._model
            self._formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=model.token_get_text(self._llm.token_eos()),
                bos_token=model.token_get_text(self._llm.token_bos()),
            )

    @property
    def context_length(self) -> int:
        return int(self._llm.n_ctx())

    def stats(self) -> EngineStats:
        return dataclasses.replace(self._stats, running_ids=tuple(self._cancel_flags))

    async def check_health(self) -> None:
        if self._llm is None:
            raise EngineError("engine is not loaded")

    async def count_tokens(self, text: str) -> int:
        tokens = await asyncio.to_thread(self._llm.tokenize, text.encode(), False, False)
        return len(tokens)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        if self._llm is None:
            raise EngineError("engine is not loaded")
        return await asyncio.to_thread(self._tokenize_sync, request)

    def _tokenize_sync(self, request: TokenizeRequest) -> TokenizeResult:
        if request.messages is not None:
            tokens = self._render_chat(request.messages, request.tools, request.add_generation_prompt)
        else:
            add_bos = request.add_special_tokens and bool(self._llm._model.add_bos_token())
            tokens = self._llm.tokenize((request.prompt or "").encode(), add_bos=add_bos, special=False)
        strs = [
            bytes(self._llm._model.detokenize([t], special=True)).decode("utf-8", errors="replace")
            for t in tokens
        ]
        return TokenizeResult(list(tokens), strs, self.context_length)

    async def detokenize(self, tokens: list[int]) -> str:
        if self._llm is None:
            raise EngineError("engine is not loaded")
        vocab = self._llm.n_vocab()
        if any(not 0 <= t < vocab for t in tokens):
            raise BadRequestError(f"Token ids must be in [0, {vocab}).", param="tokens")
        raw = await asyncio.to_thread(self._llm.detokenize, tokens)
        return bytes(raw).decode("utf-8", errors="replace")

    async def abort(self, request_id: str) -> bool:
        flag = self._cancel_flags.get(request_id)
        if flag is not None:
            flag.set()
        return flag is not None

    # -- generation -------------------------------------------------------------------------

    def _render_chat(
        self, messages: list[ChatMessage], tools: ToolsSpec | None, add_generation_prompt: bool = True
    ) -> list[int]:
        if self._formatter is None:
            raise BadRequestError("This model has no chat template; use /v1/completions.", param="messages")
        formatter = self._formatter
        if not add_generation_prompt:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            formatter = Jinja2ChatFormatter(
                template=formatter.template,
                eos_token=formatter.eos_token,
                bos_token=formatter.bos_token,
                add_generation_prompt=False,
            )
        try:
            rendered = formatter(messages=tool_calls.render_messages(messages, tools))
        except Exception as exc:  # the template's own raise_exception(): bad turn order etc.
            raise BadRequestError(f"Chat template rejected the messages: {exc}", param="messages") from None
        return list(
            self._llm.tokenize(rendered.prompt.encode(), add_bos=not rendered.added_special, special=True)
        )

    def _prompt_tokens(self, request: GenerateRequest) -> list[int]:
        if request.messages is not None:
            return self._render_chat(request.messages, request.tools)
        if isinstance(request.prompt, list):
            vocab = self._llm.n_vocab()
            if any(not 0 <= t < vocab for t in request.prompt):
                raise BadRequestError(f"Token ids must be in [0, {vocab}).", param="prompt")
            if request.suffix is not None:
                raise UnsupportedParameterError("`suffix` needs a text prompt.", param="suffix")
            return list(request.prompt)
        if request.suffix is not None:
            return self._fill_in_middle(request.prompt or "", request.suffix)
        return self._llm.tokenize((request.prompt or "").encode(), add_bos=True, special=False)

    def _fill_in_middle(self, prefix: str, suffix: str) -> list[int]:
        """Prefix-suffix-middle order with the model's own FIM tokens (as llama.cpp's server)."""
        import llama_cpp

        vocab = self._llm._model.vocab
        pre, suf, mid = (
            llama_cpp.llama_vocab_fim_pre(vocab),
            llama_cpp.llama_vocab_fim_suf(vocab),
            llama_cpp.llama_vocab_fim_mid(vocab),
        )
        if min(pre, suf, mid) < 0:
            raise UnsupportedParameterError(
                "`suffix` (fill in the middle) needs a model with FIM tokens; this model has none "
                f"({sampling_lib.BACKEND} backend).",
                param="suffix",
            )
        tokenize = self._llm.tokenize
        bos = [self._llm.token_bos()] if self._llm._model.add_bos_token() else []
        return [
            *bos,
            pre,
            *tokenize(prefix.encode(), add_bos=False, special=False),
            suf,
            *tokenize(suffix.encode(), add_bos=False, special=False),
            mid,
        ]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        if self._llm is None:
            raise EngineError("engine is not loaded")
        if self._embedding:
            raise BadRequestError("This model only serves embeddings.", param="model")
        tokens = await asyncio.to_thread(self._prompt_tokens, request)
        budget = completion_budget(request, len(tokens), self.context_length)
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(32)
        # Built off the engine thread: grammar compilation reads only the (immutable) vocabulary,
        # and a schema llama.cpp cannot compile is refused before anything is streamed.
        sampler = await asyncio.to_thread(
            sampling_lib.build_sampler, self._llm, request.sampling, request.tools, seed
        )

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        self._cancel_flags[request.request_id] = cancel
        self._stats.requests_total += 1
        self._stats.running += 1

        def emit(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        future = loop.run_in_executor(
            self._executor, self._decode, request, tokens, budget, sampler, cancel, emit
        )
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    finished = True
                    break
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
            await future
        finally:
            self._stats.running -= 1
            self._cancel_flags.pop(request.request_id, None)
            if not finished:
                cancel.set()
                self._stats.aborted_total += 1

    def _decode(
        self,
        request: GenerateRequest,
        prompt: list[int],
        budget: int,
        sampler: Any,
        cancel: threading.Event,
        emit: Callable[[Any], None],
    ) -> None:
        """Runs on the engine thread: the whole decode loop for one sequence."""
        try:
            if not cancel.is_set():
                self._decode_tokens(request, prompt, budget, sampler, cancel, emit)
        except BaseException as exc:  # surfaces in the request's generator, not in the thread
            emit(exc if isinstance(exc, BadRequestError) else EngineError(f"llama.cpp failed: {exc}"))
        finally:
            sampler.close()
            emit(_DONE)

    def _decode_tokens(
        self,
        request: GenerateRequest,
        prompt: list[int],
        budget: int,
        sampler: Any,
        cancel: threading.Event,
        emit: Callable[[Any], None],
    ) -> None:
        llm, sampling = self._llm, request.sampling
        seq = SequenceOutput(llm, request, len(prompt), budget, emit, self._stats)
        if sampling.prompt_logprobs is not None:
            seq.builder.prompt_logprobs = sampling_lib.eval_prompt_with_logprobs(
                llm, prompt, sampling.prompt_logprobs
            )
        else:
            sampling_lib.prefill(llm, prompt)
        ctx = llm._ctx.ctx
        while not cancel.is_set():
            token = sampler.sample(ctx)
            if seq.push(token, ctx, -1):
                return
            llm.eval([token])
        seq.finish("abort")

    # -- embeddings ---------------------------------------------------------------------------

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        if self._llm is None:
            raise EngineError("engine is not loaded")
        if not self._embedding:
            raise BadRequestError("This model does not serve embeddings.", param="model")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._embed_sync, request.inputs)

    def _embed_sync(self, inputs: list[str] | list[list[int]]) -> EmbedResult:
        """Mirrors `Llama.embed`, but also takes token ids (a valid OpenAI `input`) and refuses
        over-long inputs instead of truncating them silently."""
        import llama_cpp

        llm = self._llm
        n_batch, n_seq_max, n_embd = llm.n_batch, llm.context_params.n_seq_max, llm.n_embd()
        seqs = [
            list(x) if isinstance(x, list) else llm.tokenize(x.encode(), add_bos=True, special=False)
            for x in inputs
        ]
        vocab = llm.n_vocab()
        for i, seq in enumerate(seqs):
            if len(seq) > n_batch:
                raise ContextLengthExceededError(
                    f"Input {i} has {len(seq)} tokens; this model's maximum is {n_batch}.",
                    param="input",
                )
            if any(not 0 <= t < vocab for t in seq):
                raise BadRequestError(f"Token ids must be in [0, {vocab}).", param="input")
        out: list[list[float]] = []

        def flush(group: list[list[int]]) -> None:
            if not group:
                return
            llm._batch.reset()
            for seq_id, seq in enumerate(group):
                llm._batch.add_sequence(seq, seq_id, True)
            llm._ctx.kv_cache_clear()
            llm._ctx.decode(llm._batch)
            for seq_id in range(len(group)):
                vec = list(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, seq_id)[:n_embd])
                norm = math.sqrt(sum(v * v for v in vec)) or 1.0
                out.append([v / norm for v in vec])

        group: list[list[int]] = []
        for seq in seqs:
            if sum(map(len, group)) + len(seq) > n_batch or len(group) >= n_seq_max:
                flush(group)
                group = []
            group.append(seq)
        flush(group)
        llm._ctx.kv_cache_clear()
        llm.reset()
        return EmbedResult(embeddings=out, prompt_tokens=sum(map(len, seqs)))
