"""llama.cpp (via llama-cpp-python) behind the engine seam.

A `Llama` instance is not re-entrant: two decodes at once abort the process. Every call that touches
the context therefore runs on one dedicated thread (a single-worker executor), which also keeps the
blocking C calls off the actor's event loop. Tokens travel back to the loop through a
`raygate.backends.streams.Pump` fed from that thread; the request's cancel flag (set by `abort()` or by the
stream being closed) is checked after every token, so an abort costs at most one more token of work.
The pump is bounded (`MAX_QUEUED_DELTAS`): when the stream's reader stops (a client that reads
nothing, through the gateway's and Ray's backpressure), the decode thread waits in `feed.put`
instead of decoding the whole answer into memory; closing the stream releases it.

The prompt side (model loading, chat template, tokenizer, sampler) is `model.LlamaModel`, shared
with the batched engine; what each sampled token goes through is `sequence.SequenceOutput`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raygate.backends.engines.base import check_token_ids, loaded
from raygate.backends.engines.llama_cpp import logprobs, prefix_reuse
from raygate.backends.engines.llama_cpp.lora import LoraAdapters, LoraKey
from raygate.backends.engines.llama_cpp.model import (
    DEFAULT_ENGINE_KWARGS,
    LlamaModel,
    Prepared,
    decode_error,
    llama_kwargs,
)
from raygate.backends.engines.llama_cpp.model_engine import LlamaModelEngine
from raygate.backends.engines.llama_cpp.sequence import SequenceOutput
from raygate.backends.streams import Pump, ThreadFeed
from raygate.protocol.capabilities import ReasoningConfig
from raygate.protocol.embeddings import unit_vector
from raygate.protocol.errors import BadRequestError, ContextLengthExceededError, EngineError
from raygate.protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    RankRequest,
    RankResult,
)

__all__ = ["DEFAULT_ENGINE_KWARGS", "LlamaCppEngine"]

# Deltas the decode thread may run ahead of the stream's reader before it waits.
MAX_QUEUED_DELTAS = 64


class LlamaCppEngine(LlamaModelEngine):
    """`backend: llama_cpp`, one sequence at a time: every call runs on one thread because a `Llama` is not
    re-entrant. Serves generation, embeddings (`embedding`), or a cross-encoder's rerank scores
    (`rank`: llama.cpp's rank pooling, LLAMA_POOLING_TYPE_RANK)."""

    def __init__(
        self,
        model_path: str,
        *,
        embedding: bool,
        engine_kwargs: dict[str, Any],
        rank: bool = False,
        reasoning: ReasoningConfig | None = None,
        name: str = "this model",
        max_loras: int | None = None,
    ) -> None:
        """`max_loras`: LoRA adapters kept loaded at once (`lora.py`; None: all)."""
        super().__init__()
        self._name = name
        self._reasoning = reasoning
        self._model_path = model_path
        self._embedding = embedding or rank
        self._rank = rank
        kwargs, cache = llama_kwargs(engine_kwargs, generation=not self._embedding)
        if cache.ram_mib is not None:
            raise ValueError("engine.prompt_cache_ram_mib needs n_seq_max > 1 (the batched engine's slots)")
        self._prompt_cache = cache.enabled
        self._kwargs = {**kwargs, "verbose": False}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-cpp")
        self._model: LlamaModel | None = None
        self._reevaluated = prefix_reuse.REEVALUATED
        self._lora = LoraAdapters(max_loras)
        # The adapter set the context's cached prompt was evaluated under.
        self._cache_key: LoraKey = ()

    async def start(self) -> None:
        if self._rank:
            import llama_cpp

            # Rerank GGUFs (bge-reranker's, say) record rank pooling; a converted classifier may not.
            self._kwargs.setdefault("pooling_type", llama_cpp.LLAMA_POOLING_TYPE_RANK)
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(
            self._executor,
            lambda: LlamaModel.load(
                self._model_path,
                embedding=self._embedding,
                kwargs=self._kwargs,
                reasoning_config=self._reasoning,
            ),
        )
        if self._embedding:
            import llama_cpp

            if model.llm.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_NONE:
                raise EngineError(f"{self._model_path} has no pooling layer; it cannot embed text")
            if self._rank and model.llm.pooling_type() != llama_cpp.LLAMA_POOLING_TYPE_RANK:
                raise EngineError(f"{self._model_path} is set up for embeddings, not rank pooling")
        elif self._prompt_cache:
            self._reevaluated = await loop.run_in_executor(
                self._executor, prefix_reuse.reevaluated_tokens, model.llm
            )
        model.name = self._name
        self._model = model

    @property
    def context_length(self) -> int:
        return int(loaded(self._model).llm.n_ctx())

    # -- generation -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        model = loaded(self._model)
        if self._embedding:
            raise BadRequestError("This model only serves embeddings.", param="model")
        self._lora.key(request.lora)  # an unknown adapter: 404 before anything is queued
        job = await model.prepare(request, self.context_length)
        loop = asyncio.get_running_loop()
        with self._running(request.request_id) as run:
            async with Pump[Delta](MAX_QUEUED_DELTAS) as pump:
                feed = pump.thread_feed(run.cancel)
                arrived = time.time()
                future = loop.run_in_executor(
                    self._executor, self._decode, model, request, job, feed, arrived
                )
                async for delta in pump:
                    # Out with its last delta: a consumer that closes on reading it left nothing.
                    run.ended = delta.finish_reason is not None
                    yield delta
                run.ended = True
            await future

    def _decode(
        self,
        model: LlamaModel,
        request: GenerateRequest,
        job: Prepared,
        feed: ThreadFeed[Delta],
        arrived: float,
    ) -> None:
        """Runs on the engine thread: the whole decode loop for one sequence. Every failure
        reaches the request's stream, none stays in the thread."""
        error: BaseException | None = None
        try:
            if not feed.cancel.is_set():
                self._decode_tokens(model, request, job, feed, arrived)
        except BaseException as exc:
            error = decode_error(exc)
        finally:
            job.sampler.close()
            feed.close(error)

    def _decode_tokens(
        self,
        model: LlamaModel,
        request: GenerateRequest,
        job: Prepared,
        feed: ThreadFeed[Delta],
        arrived: float,
    ) -> None:
        """`arrived`: when the request reached the engine (time.time); the wait for this one
        engine thread until now is its queue time."""
        llm = model.llm
        seq = SequenceOutput(llm, request, job, feed.put, self._stats)
        seq.builder.queued = (arrived, time.time())
        key = self._lora.key(request.lora)
        # One sequence at a time: nothing else holds an adapter, so there is always room.
        if not self._lora.acquire(llm._model.model, llm._ctx.ctx, key):
            raise RuntimeError("no room for the request's LoRA adapters")
        try:
            self._lora.apply(llm._ctx.ctx, key)
            self._decode_under(model, request, job, feed, seq, key)
        finally:
            self._lora.release(llm._ctx.ctx, key)

    def _decode_under(
        self,
        model: LlamaModel,
        request: GenerateRequest,
        job: Prepared,
        feed: ThreadFeed[Delta],
        seq: SequenceOutput,
        key: LoraKey,
    ) -> None:
        llm, sampling, cancel = model.llm, request.sampling, feed.cancel
        same_adapters, self._cache_key = self._cache_key == key, key
        if sampling.prompt_logprobs is not None:
            seq.builder.prompt_logprobs = logprobs.eval_prompt_with_logprobs(
                llm, job.prompt, sampling.prompt_logprobs, self._stats
            )
        else:
            reused = prefix_reuse.prefill(
                llm, job.prompt, self._reevaluated, self._stats, reuse=self._prompt_cache and same_adapters
            )
            seq.builder.cached_tokens = reused
            self._stats.count_prompt_cache(reused)
        ctx = llm._ctx.ctx
        while not cancel.is_set():
            token = job.sampler.sample(ctx)
            if seq.push(token, ctx, -1):
                return
            with self._stats.forward(1):
                llm.eval([token])
        seq.finish("abort")

    # -- LoRA adapters (lora.py) ----------------------------------------------------------------

    async def load_adapter(self, name: str, path: str) -> None:
        """On the engine thread, after the decode in progress (a load changes the model's graph)."""
        llm = loaded(self._model).llm
        if self._embedding:
            raise BadRequestError("LoRA adapters need a generation model.", param="lora_name")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            self._executor, self._lora.register, llm._model.model, llm._ctx.ctx, name, path
        )

    async def unload_adapter(self, name: str) -> None:
        """Refused to new requests at once; freed on the engine thread once the decode in progress
        (the only one: one sequence at a time) is over."""
        llm = loaded(self._model).llm
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._lora.unregister, llm._ctx.ctx, name)

    # -- embeddings ---------------------------------------------------------------------------

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        llm = loaded(self._model).llm
        if not self._embedding or self._rank:
            raise BadRequestError("This model does not serve embeddings.", param="model")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._embed_sync, llm, request.inputs)

    @classmethod
    def _embed_sync(cls, llm: Any, inputs: list[str] | list[list[int]]) -> EmbedResult:
        """Mirrors `Llama.embed`, but also takes token ids (a valid OpenAI `input`) and refuses
        over-long inputs instead of truncating them silently."""
        seqs = [
            list(x) if isinstance(x, list) else llm.tokenize(x.encode(), add_bos=True, special=False)
            for x in inputs
        ]
        vocab = llm.n_vocab()
        for i, seq in enumerate(seqs):
            if len(seq) > llm.n_batch:
                raise ContextLengthExceededError(
                    f"Input {i} has {len(seq)} tokens; this model's maximum is {llm.n_batch}.",
                    param="input",
                )
            check_token_ids(seq, vocab, "input")
        pooled = cls._pooled(llm, seqs, llm.n_embd())
        return EmbedResult(embeddings=[unit_vector(v) for v in pooled], prompt_tokens=sum(map(len, seqs)))

    # -- rerank -------------------------------------------------------------------------------

    async def rank(self, request: RankRequest) -> RankResult:
        llm = loaded(self._model).llm
        if not self._rank:
            raise BadRequestError("This model does not serve rerank.", param="model")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._rank_sync, llm, request)

    @classmethod
    def _rank_sync(cls, llm: Any, request: RankRequest) -> RankResult:
        """One logit per (query, document) pair. The pair is laid out as llama.cpp's own server
        does for rerank (`format_prompt_rerank`): [BOS] query [EOS] [SEP] document [EOS], each
        special token only where the GGUF asks for it; for BERT that is transformers' own
        `[CLS] query [SEP] document [SEP]`, for XLM-RoBERTa (bge-reranker) `<s> q </s></s> d </s>`."""
        import llama_cpp

        vocab = llm._model.vocab
        bos = [llm.token_bos()] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
        eos = [llm.token_eos()] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
        sep = [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []

        def ids(text: str) -> list[int]:
            return list(llm.tokenize(text.encode(), add_bos=False, special=False))

        queries = {q: ids(q) for q in dict.fromkeys(q for q, _ in request.pairs)}
        seqs = [bos + queries[q] + eos + sep + ids(d) + eos for q, d in request.pairs]
        for i, seq in enumerate(seqs):
            if len(seq) > llm.n_batch:
                raise ContextLengthExceededError(
                    f"Pair {i} (query and {request.param}[{i}]) has {len(seq)} tokens; this model's "
                    f"maximum is {llm.n_batch}. Shorten the document or the query.",
                    param=request.param,
                )
        scores = [v[0] for v in cls._pooled(llm, seqs, 1)]
        return RankResult(scores=scores, prompt_tokens=sum(map(len, seqs)))

    @staticmethod
    def _pooled(llm: Any, seqs: list[list[int]], width: int) -> list[list[float]]:
        """The model's pooled output (the first `width` floats) for each sequence, decoding as many
        sequences per batch as `n_batch` and `n_seq_max` allow."""
        import llama_cpp

        n_batch, n_seq_max = llm.n_batch, llm.context_params.n_seq_max
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
                out.append(list(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, seq_id)[:width]))

        group: list[list[int]] = []
        for seq in seqs:
            if sum(map(len, group)) + len(seq) > n_batch or len(group) >= n_seq_max:
                flush(group)
                group = []
            group.append(seq)
        flush(group)
        llm._ctx.kv_cache_clear()
        llm.reset()
        return out
