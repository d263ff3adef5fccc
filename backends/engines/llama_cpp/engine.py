"""llama.cpp (via llama-cpp-python) behind the engine seam.

A `Llama` instance is not re-entrant: two decodes at once abort the process. Every call that touches
the context therefore runs on one dedicated thread (a single-worker executor), which also keeps the
blocking C calls off the actor's event loop. Tokens travel back to the loop through a
`backends.streams.Pump` fed from that thread; the request's cancel flag (set by `abort()` or by the
stream being closed) is checked after every token, so an abort costs at most one more token of work.
The pump is bounded (`MAX_QUEUED_DELTAS`): when the stream's reader stops (a client that reads
nothing, through the gateway's and Ray's backpressure), the decode thread waits in `feed.put`
instead of decoding the whole answer into memory; closing the stream releases it.

The prompt side (model loading, chat template, tokenizer, sampler) is `model.LlamaModel`, shared
with the batched engine; what each sampled token goes through is `sequence.SequenceOutput`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from backends.engines.base import check_token_ids, loaded
from backends.engines.llama_cpp import sampling as sampling_lib
from backends.engines.llama_cpp.model import (
    DEFAULT_ENGINE_KWARGS,
    LlamaModel,
    Prepared,
    decode_error,
    llama_kwargs,
)
from backends.engines.llama_cpp.model_engine import LlamaModelEngine
from backends.engines.llama_cpp.sequence import SequenceOutput
from backends.streams import Pump, ThreadFeed
from protocol.embeddings import unit_vector
from protocol.errors import BadRequestError, ContextLengthExceededError, EngineError
from protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
)

__all__ = ["DEFAULT_ENGINE_KWARGS", "LlamaCppEngine"]

# Deltas the decode thread may run ahead of the stream's reader before it waits.
MAX_QUEUED_DELTAS = 64


class LlamaCppEngine(LlamaModelEngine):
    """`backend: llama_cpp`, one sequence at a time: every call runs on one thread because a `Llama` is not
    re-entrant. Serves generation and embeddings."""

    def __init__(self, model_path: str, *, embedding: bool, engine_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self._model_path = model_path
        self._embedding = embedding
        kwargs, self._prompt_cache = llama_kwargs(engine_kwargs)
        self._kwargs = {**kwargs, "verbose": False}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-cpp")
        self._model: LlamaModel | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(
            self._executor,
            lambda: LlamaModel.load(self._model_path, embedding=self._embedding, kwargs=self._kwargs),
        )
        if self._embedding:
            import llama_cpp

            if model.llm.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_NONE:
                raise EngineError(f"{self._model_path} has no pooling layer; it cannot embed text")
        self._model = model

    @property
    def context_length(self) -> int:
        return int(loaded(self._model).llm.n_ctx())

    # -- generation -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        model = loaded(self._model)
        if self._embedding:
            raise BadRequestError("This model only serves embeddings.", param="model")
        job = await model.prepare(request, self.context_length)
        loop = asyncio.get_running_loop()
        with self._running(request.request_id) as run:
            async with Pump[Delta](MAX_QUEUED_DELTAS) as pump:
                feed = pump.thread_feed(run.cancel)
                future = loop.run_in_executor(self._executor, self._decode, model, request, job, feed)
                async for delta in pump:
                    yield delta
                run.ended = True
            await future

    def _decode(
        self, model: LlamaModel, request: GenerateRequest, job: Prepared, feed: ThreadFeed[Delta]
    ) -> None:
        """Runs on the engine thread: the whole decode loop for one sequence. Every failure
        reaches the request's stream, none stays in the thread."""
        error: BaseException | None = None
        try:
            if not feed.cancel.is_set():
                self._decode_tokens(model, request, job, feed)
        except BaseException as exc:
            error = decode_error(exc)
        finally:
            job.sampler.close()
            feed.close(error)

    def _decode_tokens(
        self, model: LlamaModel, request: GenerateRequest, job: Prepared, feed: ThreadFeed[Delta]
    ) -> None:
        llm, sampling, cancel = model.llm, request.sampling, feed.cancel
        seq = SequenceOutput(llm, request, len(job.prompt), job.budget, feed.put, self._stats)
        if sampling.prompt_logprobs is not None:
            seq.builder.prompt_logprobs = sampling_lib.eval_prompt_with_logprobs(
                llm, job.prompt, sampling.prompt_logprobs
            )
        else:
            reused = sampling_lib.prefill(llm, job.prompt, reuse=self._prompt_cache)
            seq.builder.cached_tokens = reused
            self._stats.count_prompt_cache(reused)
        ctx = llm._ctx.ctx
        while not cancel.is_set():
            token = job.sampler.sample(ctx)
            if seq.push(token, ctx, -1):
                return
            llm.eval([token])
        seq.finish("abort")

    # -- embeddings ---------------------------------------------------------------------------

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        llm = loaded(self._model).llm
        if not self._embedding:
            raise BadRequestError("This model does not serve embeddings.", param="model")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._embed_sync, llm, request.inputs)

    @staticmethod
    def _embed_sync(llm: Any, inputs: list[str] | list[list[int]]) -> EmbedResult:
        """Mirrors `Llama.embed`, but also takes token ids (a valid OpenAI `input`) and refuses
        over-long inputs instead of truncating them silently."""
        import llama_cpp

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
            check_token_ids(seq, vocab, "input")
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
                out.append(unit_vector(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, seq_id)[:n_embd]))

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
