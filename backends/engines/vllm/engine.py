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

What turns a request into token ids and `SamplingParams`, and vLLM's outputs into `Delta`s, is in
translate.py; engine arguments are in engine_args.py, logprob pieces in logprobs.py and scheduler
counters in stats.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from raygate.backends.engines.base import (
    Engine,
    EngineStats,
    check_token_ids,
    loaded,
    truncate_prompt,
)
from raygate.backends.engines.images import has_images
from raygate.backends.engines.reasoning import (
    START,
    ReasoningFormat,
    can_disable,
    closing_text,
    detect,
    markers,
)
from raygate.backends.engines.reasoning import resolve as resolve_reasoning
from raygate.backends.engines.vllm import engine_args
from raygate.backends.engines.vllm.logprobs import TokenPieces
from raygate.backends.engines.vllm.lora import VllmAdapters
from raygate.backends.engines.vllm.stats import CoreCounters, VllmEngineStats, stat_logger_factory
from raygate.backends.engines.vllm.thinking_track import THINKING_EXTRA_KEY
from raygate.backends.engines.vllm.tokenizer_thread import TokenizerThread
from raygate.backends.engines.vllm.translate import (
    DeltaRelay,
    chat_text,
    embed_ids,
    end_of_generation,
    error_param,
    generate_params,
    image_data,
    pair_inputs,
    prompt_ids,
    single_token_markers,
    starts_thinking,
    thinking_args,
    vllm_priority,
    vllm_thinking_budget,
)
from raygate.backends.heap import freeze_startup_heap
from raygate.protocol.capabilities import ReasoningConfig
from raygate.protocol.embeddings import unit_vector
from raygate.protocol.errors import (
    BadRequestError,
    EngineError,
    ServiceUnavailableError,
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
        reasoning: ReasoningConfig | None = None,
        lora: bool = False,
        vision: bool = False,
        name: str = "this model",
    ) -> None:
        """`vision`: the model reads images (its `vision:` block); `name`: the model's, for errors."""
        super().__init__(VllmEngineStats())
        self._vision = vision
        self._name = name
        self._reasoning = reasoning
        self._thinks: ReasoningFormat | None = None  # resolved against the chat template at start
        self._start_ids: list[int] = []  # `<think>` as tokens: where vLLM counts the budget from
        # `<think>` and `</think>` when each is one token: then a grammar waits for the end marker
        # and an end of generation while thinking becomes it (else: thinking off under a grammar).
        self._markers: tuple[int, int] | None = None
        self._harmony_gate = False  # the engine's grammar gate is harmony_gate.py's
        self._gated = False  # a grammar may wait for the end of thinking (`_build`)
        self._eos: list[int] = []  # the model's end-of-generation tokens
        self._kwargs = engine_args.engine_kwargs(
            model_path, embedding=embedding or rank, user_kwargs=engine_kwargs, num_gpus=num_gpus
        )
        if lora:  # the spec lists adapters: vLLM's `--enable-lora`, unless the config says otherwise
            self._kwargs.setdefault("enable_lora", True)
        # A rebuilt engine (after an EngineCore death) has none loaded: vLLM reads an adapter's
        # folder again on its first request, since every request carries its `LoRARequest`.
        self._adapters = VllmAdapters()
        # A cross-encoder (`rank`) runs on vLLM's pooling runner too, as a classifier.
        self._embedding = embedding or rank
        self._rank = rank
        self._llm: Any = None
        self._tokenizer: Any = None
        self._tokenizing = TokenizerThread()  # every tokenizer call (tokenizer_thread.py)
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

        kwargs = dict(self._kwargs)
        if self._reasoning is not None and self._reasoning.parser != "none":
            # vLLM's sampler enforces thinking budgets, holds grammars until the end marker and
            # (thinking_end.py) keeps a thinking model from ending its turn; no vLLM reasoning
            # parser reaches the output: the split is Raygate's (reasoning.py).
            # gpt-oss's harmony: its multi-token markers for the budget, and its own grammar gate
            # (harmony_gate.py: the final channel's header, not one `</think>` token).
            parser = self._reasoning.parser
            if parser == "auto":  # read from the folder's template now: the markers are made here
                parser = detect(engine_args.folder_chat_template(self._kwargs["model"])) or "auto"
            start, end = markers(parser)
            self._harmony_gate = start != START
            kwargs = engine_args.with_reasoning(kwargs, start, end, harmony=self._harmony_gate)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as exc:  # an unknown key in the config's `engine:` block
            raise ValueError(f"bad vLLM engine option: {exc}") from None
        llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[stat_logger_factory(self._counters)]
        )
        self._tokenizer = llm.get_tokenizer()
        self._thinks = resolve_reasoning(self._reasoning, getattr(self._tokenizer, "chat_template", None))
        start = markers(self._thinks.parser)[0] if self._thinks is not None else START
        self._start_ids = list(self._tokenizer.encode(start, add_special_tokens=False))
        harmony = self._thinks is not None and self._thinks.parser == "harmony"
        self._markers = single_token_markers(self._tokenizer) if self._thinks and not harmony else None
        # Whether a grammar can wait for the thinking to end: `</think>` as one token, or the
        # harmony gate (only when the spec named the parser: the engine's gate is set up before
        # the template is read, so `auto` on a harmony template answers constrained requests
        # with an empty analysis channel).
        self._gated = self._markers is not None or (harmony and self._harmony_gate)
        self._eos = end_of_generation(self._tokenizer, llm.model_config.try_get_generation_config())
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
                freeze_startup_heap()  # the new engine's objects, as the replica did at its start
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
        return len(await self._tokenizing.run(self._tokenizer.encode, text, add_special_tokens=False))

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        self._engine()
        return await self._tokenizing.run(self._tokenize_sync, request)

    def _tokenize_sync(self, request: TokenizeRequest) -> TokenizeResult:
        assert self._pieces is not None
        if request.messages is not None:
            switch = None if request.thinking is None else {"enable_thinking": request.thinking}
            text = chat_text(
                self._tokenizer, request.messages, request.tools, request.add_generation_prompt, switch
            )
            thinks = self._thinks
            if (
                thinks is not None
                and request.thinking is False
                and request.add_generation_prompt
                and can_disable(thinks.parser)
            ):
                text += closing_text(text, thinks.parser)
            ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        else:
            ids = list(
                self._tokenizer.encode(request.prompt or "", add_special_tokens=request.add_special_tokens)
            )
        return TokenizeResult(ids, [self._pieces(t, None)[0] for t in ids], self._context)

    async def detokenize(self, tokens: list[int]) -> str:
        self._engine()
        check_token_ids(tokens, self._vocab, "tokens")
        return str(await self._tokenizing.run(self._tokenizer.decode, tokens))

    async def abort(self, request_id: str) -> bool:
        """Also tells AsyncLLM, which holds the request in its own queue and batch."""
        known = await super().abort(request_id)
        if known and self._llm is not None:
            await self._llm.abort(request_id)
        return known

    # -- generation -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._engine()
        if self._embedding:
            raise BadRequestError("This model only serves embeddings.", param="model")
        if request.suffix is not None:
            # vLLM's own server refuses it too: fill-in-the-middle needs the model's FIM tokens.
            raise UnsupportedParameterError("`suffix` is not supported by the vllm backend.", param="suffix")
        images = has_images(request.messages)
        if images and not self._vision:  # the gateway refuses it first
            raise BadRequestError(
                f"Model `{self._name}` does not accept images: it has no `vision:` block.", param="messages"
            )
        # On the tokenizer's thread: tokenisers and Jinja templates are CPU work.
        markers = self._markers
        ids, thinking = await self._tokenizing.run(
            prompt_ids, self._tokenizer, request, self._vocab, self._thinks, self._gated
        )
        ids = truncate_prompt(ids, request.sampling.truncate_prompt_tokens, self._context)
        budget = vllm_thinking_budget(thinking, ids, self._start_ids)
        extra = thinking_args(thinking, *markers, self._eos) if markers is not None else None
        params = generate_params(request, ids, self._context, self._vocab, budget, extra)
        # A grammar starts at once unless the output begins in thinking (then after `</think>`).
        reasoning_ended = not self._gated or not starts_thinking(thinking)
        adapter = self._adapters.request(request.lora)
        assert self._pieces is not None
        relay = DeltaRelay(ids, request, self._pieces, thinking, (extra or {}).get(THINKING_EXTRA_KEY))

        rid = request.request_id
        with self._running(rid) as run:
            # With images the prompt holds the model's image token where each goes; vLLM's
            # processor expands it into the image's tokens (usage counts them: `relay.read`).
            prompt = {
                "prompt_token_ids": ids,
                **(await asyncio.to_thread(image_data, request) if images else {}),
            }
            stream = llm.generate(
                prompt,
                params,
                rid,
                lora_request=adapter,
                priority=vllm_priority(request),
                reasoning_ended=reasoning_ended,
            )
            try:
                async with self._adapters.using(llm, adapter), contextlib.aclosing(stream):
                    # Closing `stream` (on our own close or cancellation) makes vLLM abort `rid`.
                    async for result in stream:
                        self._stats.tokens_generated_total += relay.read(result)
                        run.ended = result.finished
                        delta = relay.delta(result)
                        if delta is not None:
                            yield delta
            except EngineDeadError:
                raise EngineError(
                    "The model's engine failed while generating; retry the request.", code="engine_dead"
                ) from None
            except VLLMClientError as exc:
                raise BadRequestError(
                    str(exc.args[0] if exc.args else exc), param=error_param(exc, request)
                ) from None

    # -- LoRA adapters (lora.py) --------------------------------------------------------------

    async def load_adapter(self, name: str, path: str) -> None:
        llm = self._engine()
        if self._embedding or not self._kwargs.get("enable_lora"):
            raise BadRequestError(
                f"LoRA adapter `{name}`: this model was started without LoRA (a generation model "
                "with `engine: {enable_lora: true}` or `adapters:` takes them).",
                param="lora_name",
            )
        await self._adapters.load(llm, name, path)

    async def unload_adapter(self, name: str) -> None:
        await self._adapters.unload(self._engine(), name)

    # -- embeddings ---------------------------------------------------------------------------

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        from vllm import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._engine()
        if not self._embedding or self._rank:
            raise BadRequestError("This model does not serve embeddings.", param="model")
        seqs = await self._tokenizing.run(
            embed_ids, self._tokenizer, request.inputs, self._context, self._vocab
        )

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

    async def rank(self, request: RankRequest) -> RankResult:
        """Raw classifier logits (no activation: the gateway applies it), all pairs at once."""
        from vllm import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._engine()
        if not self._rank:
            raise BadRequestError("This model does not serve rerank.", param="model")
        inputs = await self._tokenizing.run(pair_inputs, self._tokenizer, request, self._context)

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
