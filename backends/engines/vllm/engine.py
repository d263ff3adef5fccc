"""vLLM's `AsyncLLM` behind the engine seam: continuous batching, many sequences per replica.

AsyncLLM is asynchronous and batches every request it holds, so unlike llama.cpp nothing here is
serialised: each `generate()` is a coroutine that feeds one vLLM request and relays its deltas,
and the replica actor's event loop runs as many of them at once as clients send.

The gateway's contract is kept on top of vLLM's:

* The prompt is tokenised here (the chat template comes from the model's tokenizer), so the
  context-length check raises `ContextLengthExceededError` before the engine sees the request.
* Usage is the engine's own count: the prompt ids vLLM reports and the token ids of each delta.
* Closing the stream closes vLLM's generator, which aborts the request in the EngineCore.
* AsyncLLM runs the model in an EngineCore child process. If it dies, vLLM fails every in-flight
  request with `EngineDeadError` (answered as a typed `EngineError`), and a watcher builds a new
  engine in this same replica, a bounded number of times, so the model serves again without the
  gateway doing anything; meanwhile requests get 503 and `check_health()` raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from backends.engines import tool_calls
from backends.engines.base import (
    Engine,
    EngineStats,
    check_token_ids,
    completion_budget,
    loaded,
    truncate_prompt,
)
from backends.engines.deltas import DeltaBuilder
from backends.engines.vllm import support as vllm_support
from backends.engines.vllm.support import (
    CoreCounters,
    TokenPieces,
    VllmEngineStats,
    stat_logger_factory,
    to_vllm_sampling,
    token_logprobs,
)
from protocol.embeddings import unit_vector
from protocol.errors import (
    BadRequestError,
    ContextLengthExceededError,
    EngineError,
    ServiceUnavailableError,
    UnsupportedParameterError,
)
from protocol.generation import (
    ChatMessage,
    Delta,
    EmbedRequest,
    EmbedResult,
    FinishReason,
    GenerateRequest,
    RankRequest,
    RankResult,
    TokenizeRequest,
    TokenizeResult,
    ToolsSpec,
)

log = logging.getLogger(__name__)

MAX_ENGINE_RESTARTS = 3
WATCH_INTERVAL_S = 1.0


class VllmEngine(Engine):
    """`backend: vllm`: one AsyncLLM per replica, many sequences at once, the gateway's contract kept on top,
    and a dead EngineCore rebuilt in place (module docstring)."""

    def __init__(
        self,
        model_path: str,
        *,
        embedding: bool,
        engine_kwargs: dict[str, Any],
        num_gpus: float = 0.0,
        rank: bool = False,
    ) -> None:
        super().__init__(VllmEngineStats())
        self._kwargs = vllm_support.engine_kwargs(
            model_path, embedding=embedding or rank, user_kwargs=engine_kwargs, num_gpus=num_gpus
        )
        # A cross-encoder (`rank`) runs on vLLM's pooling runner too, as a classifier.
        self._embedding = embedding or rank
        self._rank = rank
        self._llm: Any = None
        self._tokenizer: Any = None
        self._pieces: TokenPieces | None = None
        self._context = 0
        self._vocab = 0
        self._counters = CoreCounters()
        self._restarts = 0
        self._watcher: asyncio.Task[None] | None = None
        self._failure: str | None = None  # set when the engine is gone for good

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._llm = await self._build()
        self._watcher = asyncio.create_task(self._watch())

    async def _build(self) -> Any:
        """Start an EngineCore (25-50 s on 2 CPU cores) off the event loop."""
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        try:
            args = AsyncEngineArgs(**self._kwargs)
        except TypeError as exc:  # an unknown key in the config's `engine:` block
            raise ValueError(f"bad vLLM engine option: {exc}") from None
        llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[stat_logger_factory(self._counters)]
        )
        self._tokenizer = llm.get_tokenizer()
        self._pieces = TokenPieces(self._tokenizer)
        self._context = int(llm.model_config.max_model_len)
        self._vocab = int(llm.model_config.get_vocab_size())
        return llm

    async def _watch(self) -> None:
        """Replace a dead EngineCore. vLLM's own monitor thread marks the engine dead; polling that
        flag once a second is cheap and needs no request to notice an idle engine's death."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            llm = self._llm
            if llm is None or not llm.errored:
                continue
            if self._restarts >= MAX_ENGINE_RESTARTS:
                self._failure = (
                    f"The model's engine failed {MAX_ENGINE_RESTARTS + 1} times; it is not restarted again."
                )
                log.error("%s", self._failure)
                return
            log.error("vLLM EngineCore died; starting a new engine in this replica")
            self._llm = None
            self._restarts += 1
            self._counters.scheduled(0, 0)
            await asyncio.to_thread(llm.shutdown)
            try:
                self._llm = await self._build()
            except Exception as exc:
                self._failure = f"The model's engine could not be restarted: {exc}"
                log.exception("could not restart the vLLM engine")
                return

    def _engine(self) -> Any:
        if self._failure is not None:
            raise EngineError(self._failure, code="engine_dead")
        llm = self._llm
        if llm is None and self._watcher is not None:
            raise ServiceUnavailableError("The model's engine is restarting after a failure; retry shortly.")
        llm = loaded(llm)
        if llm.errored:
            raise EngineError("The model's engine has failed; retry shortly.", code="engine_dead")
        return llm

    @property
    def context_length(self) -> int:
        return self._context

    def stats(self) -> EngineStats:
        """The shared counters plus vLLM's own view (`VllmEngineStats`)."""
        snapshot = super().stats()
        assert isinstance(snapshot, VllmEngineStats)
        snapshot.engine_restarts = self._restarts
        c = self._counters
        snapshot.core_running, snapshot.core_waiting = c.running, c.waiting
        snapshot.core_peak_running = c.peak_running
        snapshot.decode_steps, snapshot.decode_tokens = c.decode_steps, c.decode_tokens
        snapshot.engine_unfinished = self._llm.get_num_unfinished_requests() if self._llm is not None else 0
        return snapshot

    async def check_health(self) -> None:
        await self._engine().check_health()

    async def count_tokens(self, text: str) -> int:
        self._engine()
        return len(await asyncio.to_thread(self._tokenizer.encode, text, add_special_tokens=False))

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        self._engine()
        return await asyncio.to_thread(self._tokenize_sync, request)

    def _tokenize_sync(self, request: TokenizeRequest) -> TokenizeResult:
        assert self._pieces is not None
        if request.messages is not None:
            ids = self._chat_ids(request.messages, request.tools, request.add_generation_prompt)
        else:
            ids = list(
                self._tokenizer.encode(request.prompt or "", add_special_tokens=request.add_special_tokens)
            )
        return TokenizeResult(ids, [self._pieces(t, None)[0] for t in ids], self._context)

    async def detokenize(self, tokens: list[int]) -> str:
        self._engine()
        check_token_ids(tokens, self._vocab, "tokens")
        return str(await asyncio.to_thread(self._tokenizer.decode, tokens))

    async def abort(self, request_id: str) -> bool:
        """Also tells AsyncLLM, which holds the request in its own queue and batch."""
        known = await super().abort(request_id)
        if known and self._llm is not None:
            await self._llm.abort(request_id)
        return known

    # -- generation -------------------------------------------------------------------------

    def _prompt_ids(self, request: GenerateRequest) -> list[int]:
        """Runs in a thread: tokenisers and Jinja templates are CPU work."""
        if request.messages is not None:
            return self._chat_ids(request.messages, request.tools)
        if isinstance(request.prompt, list):
            check_token_ids(request.prompt, self._vocab, "prompt")
            return list(request.prompt)
        return list(self._tokenizer.encode(request.prompt or "", add_special_tokens=True))

    def _chat_ids(
        self, messages: list[ChatMessage], tools: ToolsSpec | None, add_generation_prompt: bool = True
    ) -> list[int]:
        """The model's own chat template over the turns as `tool_calls.render_messages` writes
        them (tools in the system turn, earlier calls and tool results as text), so follow-up
        turns and tool results work with templates that know nothing of tools."""
        from jinja2 import TemplateError

        tok = self._tokenizer
        if not getattr(tok, "chat_template", None):
            raise BadRequestError("This model has no chat template; use /v1/completions.", param="messages")
        try:
            text = tok.apply_chat_template(
                tool_calls.render_messages(messages, tools),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except (TemplateError, ValueError) as exc:  # the template's raise_exception(): bad turn order
            raise BadRequestError(f"Chat template rejected the messages: {exc}", param="messages") from None
        # The template writes the special tokens itself (as vLLM's chat endpoint does).
        return list(tok.encode(text, add_special_tokens=False))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._engine()
        if self._embedding:
            raise BadRequestError("This model only serves embeddings.", param="model")
        if request.suffix is not None:
            # vLLM's own server refuses it too: fill-in-the-middle needs the model's FIM tokens.
            raise UnsupportedParameterError("`suffix` is not supported by the vllm backend.", param="suffix")
        ids = await asyncio.to_thread(self._prompt_ids, request)
        ids = truncate_prompt(ids, request.sampling.truncate_prompt_tokens, self._context)
        check_token_ids(request.sampling.stop_token_ids, self._vocab, "stop_token_ids")
        check_token_ids(request.sampling.allowed_token_ids or [], self._vocab, "allowed_token_ids")
        if not ids:
            raise BadRequestError("The prompt is empty.", param=request.prompt_param)
        budget = completion_budget(request, len(ids), self._context)
        params = to_vllm_sampling(request.sampling, budget, request.tools)
        sampling, pieces = request.sampling, self._pieces
        assert pieces is not None
        parser = tool_calls.ToolCallParser() if tool_calls.active(request.tools) else None
        out = DeltaBuilder(len(ids), parser)

        rid = request.request_id
        with self._running(rid) as run:
            stream = llm.generate({"prompt_token_ids": ids}, params, rid)
            try:
                async with contextlib.aclosing(stream):
                    # Closing `stream` (on our own close or cancellation) makes vLLM abort `rid`.
                    async for result in stream:
                        piece = result.outputs[0]
                        if result.prompt_token_ids:
                            out.n_prompt = len(result.prompt_token_ids)
                        if result.num_cached_tokens is not None:
                            out.cached_tokens = result.num_cached_tokens
                        if sampling.prompt_logprobs is not None and result.prompt_logprobs:
                            out.prompt_logprobs = token_logprobs(
                                pieces, ids, list(result.prompt_logprobs), sampling.prompt_logprobs
                            )
                        if sampling.logprobs is not None and piece.logprobs:
                            out.logprobs += token_logprobs(
                                pieces, list(piece.token_ids), list(piece.logprobs), sampling.logprobs
                            )
                        out.n_out += len(piece.token_ids)
                        self._stats.tokens_generated_total += len(piece.token_ids)
                        run.ended = result.finished
                        finish = _finish_reason(piece.finish_reason) if run.ended else None
                        # vLLM's `stop_reason`: the stop string hit (str), a stop token id, or None.
                        hit = piece.stop_reason if isinstance(piece.stop_reason, str) else None
                        delta = out.delta(piece.text, finish, hit)
                        if delta is not None:
                            yield delta
            except EngineDeadError:
                raise EngineError(
                    "The model's engine failed while generating; retry the request.", code="engine_dead"
                ) from None
            except VLLMClientError as exc:
                raise BadRequestError(
                    str(exc.args[0] if exc.args else exc), param=_error_param(exc, request)
                ) from None

    # -- embeddings ---------------------------------------------------------------------------

    def _embed_ids(self, inputs: list[str] | list[list[int]]) -> list[list[int]]:
        seqs = [
            list(x) if isinstance(x, list) else list(self._tokenizer.encode(x, add_special_tokens=True))
            for x in inputs
        ]
        for i, seq in enumerate(seqs):
            if len(seq) > self._context:
                raise ContextLengthExceededError(
                    f"Input {i} has {len(seq)} tokens; this model's maximum is {self._context}.",
                    param="input",
                )
            check_token_ids(seq, self._vocab, "input")
        return seqs

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        from vllm import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._engine()
        if not self._embedding or self._rank:
            raise BadRequestError("This model does not serve embeddings.", param="model")
        seqs = await asyncio.to_thread(self._embed_ids, request.inputs)

        async def one(i: int, ids: list[int]) -> tuple[list[float], int]:
            final = None
            rid = f"{request.request_id}-{i}"
            async for out in llm.encode({"prompt_token_ids": ids}, PoolingParams(task="embed"), rid):
                final = out
            assert final is not None
            vec = [float(v) for v in final.outputs.data.tolist()]
            return unit_vector(vec), len(final.prompt_token_ids)

        self._stats.requests_total += 1
        try:
            # All inputs go to the engine at once: it batches them like concurrent requests.
            results = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(seqs)))
        except EngineDeadError:
            raise EngineError(
                "The model's engine failed while embedding; retry the request.", code="engine_dead"
            ) from None
        return EmbedResult(embeddings=[vec for vec, _ in results], prompt_tokens=sum(n for _, n in results))

    # -- rerank -------------------------------------------------------------------------------

    def _pair_inputs(self, request: RankRequest) -> list[tuple[list[int], int]]:
        """Each pair as the tokenizer lays it out for a cross-encoder (`[CLS] q [SEP] d [SEP]`),
        with where its second segment starts: vLLM takes token types in that compressed form
        (its own score endpoint does the same, `compressed_token_type_ids`)."""
        out: list[tuple[list[int], int]] = []
        for i, (query, doc) in enumerate(request.pairs):
            enc = self._tokenizer(query, doc, add_special_tokens=True)
            ids = list(enc["input_ids"])
            if len(ids) > self._context:
                raise ContextLengthExceededError(
                    f"Pair {i} (query and {request.param}[{i}]) has {len(ids)} tokens; this model's "
                    f"maximum is {self._context}. Shorten the document or the query.",
                    param=request.param,
                )
            types = list(enc.get("token_type_ids") or [])
            out.append((ids, types.index(1) if 1 in types else len(ids)))
        return out

    async def rank(self, request: RankRequest) -> RankResult:
        """Raw classifier logits (no activation: the gateway applies it), all pairs at once."""
        from vllm import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._engine()
        if not self._rank:
            raise BadRequestError("This model does not serve rerank.", param="model")
        inputs = await asyncio.to_thread(self._pair_inputs, request)

        async def one(i: int, ids: list[int], second: int) -> tuple[float, int]:
            params = PoolingParams(
                task="classify", use_activation=False, extra_kwargs={"compressed_token_type_ids": second}
            )
            final = None
            async for out in llm.encode({"prompt_token_ids": ids}, params, f"{request.request_id}-{i}"):
                final = out
            assert final is not None
            return float(final.outputs.data.reshape(-1)[0]), len(final.prompt_token_ids)

        self._stats.requests_total += 1
        try:
            results = await asyncio.gather(*(one(i, ids, second) for i, (ids, second) in enumerate(inputs)))
        except EngineDeadError:
            raise EngineError(
                "The model's engine failed while scoring; retry the request.", code="engine_dead"
            ) from None
        return RankResult(scores=[s for s, _ in results], prompt_tokens=sum(n for _, n in results))


def _error_param(exc: Exception, request: GenerateRequest) -> str:
    """The request field a vLLM validation error is about, by OpenAI's names."""
    named = getattr(exc, "parameter", None)
    if named in ("logit_bias", "logprobs", "seed", "stop", "allowed_token_ids", "bad_words"):
        return str(named)
    if named == "prompt_logprobs":
        return "logprobs"
    if named == "structured_outputs" or "grammar" in str(exc).lower() or "schema" in str(exc).lower():
        if request.sampling.constrained:
            return tool_calls.constraint_param(request.sampling)
        if tool_calls.active(request.tools):
            return "tools"
    return request.prompt_param


def _finish_reason(reason: object) -> FinishReason:
    """vLLM's reasons as OpenAI's; its `error` (a request-level engine failure) is an error here."""
    text = str(reason)
    if text in ("stop", "length", "abort"):
        return text  # type: ignore[return-value]
    if text == "repetition":  # vLLM stopped a degenerate loop: the model chose to stop, in effect
        return "stop"
    raise EngineError(f"The engine failed this request ({text}); retry it.")
