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
  gateway doing anything; meanwhile requests get 503 and `check_health()` raises (supervisor.py).

What turns a request into token ids and `SamplingParams`, and vLLM's outputs into `Delta`s, is in
translate.py; embeddings and rerank in pooling.py; engine arguments are in engine_args.py, a
reasoning model's thinking as each start settles it in thinking_setup.py, logprob pieces in
logprobs.py and scheduler counters in stats.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from raygate.backends.engines.base import (
    Engine,
    EngineStats,
    check_token_ids,
    truncate_prompt,
)
from raygate.backends.engines.images import has_images
from raygate.backends.engines.vllm import engine_args, pooling
from raygate.backends.engines.vllm.logprobs import TokenPieces
from raygate.backends.engines.vllm.lora import VllmAdapters
from raygate.backends.engines.vllm.stats import CoreCounters, VllmEngineStats, stat_logger_factory
from raygate.backends.engines.vllm.supervisor import EngineSupervisor
from raygate.backends.engines.vllm.thinking_setup import ThinkingSetup, thinking_setup, with_thinking
from raygate.backends.engines.vllm.thinking_track import THINKING_EXTRA_KEY
from raygate.backends.engines.vllm.tokenizer_thread import TokenizerThread
from raygate.backends.engines.vllm.translate import (
    DeltaRelay,
    error_param,
    generate_params,
    image_data,
    prompt_ids,
    starts_thinking,
    thinking_args,
    tokenize_request,
    vllm_priority,
    vllm_thinking_budget,
)
from raygate.protocol.capabilities import ReasoningConfig
from raygate.protocol.errors import (
    BadRequestError,
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
        self._thinking = ThinkingSetup()  # settled at each start (thinking_setup.py)
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
        self._tokenizer: Any = None
        self._tokenizing = TokenizerThread()  # every tokenizer call (tokenizer_thread.py)
        self._pieces: TokenPieces | None = None
        self._context = 0
        self._vocab = 0
        self._counters = CoreCounters()
        self._supervisor = EngineSupervisor(self._build, self._counters)  # the AsyncLLM (supervisor.py)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._supervisor.start()

    async def _build(self) -> Any:
        """Start an EngineCore (25-50 s on 2 CPU cores) off the event loop."""
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs, harmony_gate = with_thinking(self._kwargs, self._reasoning)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as exc:  # an unknown key in the config's `engine:` block
            raise ValueError(f"bad vLLM engine option: {exc}") from None
        llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[stat_logger_factory(self._counters)]
        )
        self._tokenizer = llm.get_tokenizer()
        self._thinking = thinking_setup(
            self._tokenizer, self._reasoning, harmony_gate, llm.model_config.try_get_generation_config()
        )
        self._pieces = TokenPieces(self._tokenizer)
        self._context = int(llm.model_config.max_model_len)
        self._vocab = int(llm.model_config.get_vocab_size())
        return llm

    @property
    def context_length(self) -> int:
        return self._context

    def stats(self) -> EngineStats:
        """The shared counters plus vLLM's own view (`VllmEngineStats`)."""
        snapshot = super().stats()
        assert isinstance(snapshot, VllmEngineStats)
        snapshot.engine_restarts = self._supervisor.restarts
        c = self._counters
        snapshot.core_running, snapshot.core_waiting = c.running, c.waiting
        snapshot.core_peak_running = c.peak_running
        snapshot.decode_steps, snapshot.decode_tokens = c.decode_steps, c.decode_tokens
        llm = self._supervisor.llm
        snapshot.engine_unfinished = llm.get_num_unfinished_requests() if llm is not None else 0
        return snapshot

    async def check_health(self) -> None:
        await self._supervisor.current().check_health()

    async def count_tokens(self, text: str) -> int:
        self._supervisor.current()
        return len(await self._tokenizing.run(self._tokenizer.encode, text, add_special_tokens=False))

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        self._supervisor.current()
        assert self._pieces is not None
        return await self._tokenizing.run(
            tokenize_request, self._tokenizer, self._pieces, request, self._thinking.thinks, self._context
        )

    async def detokenize(self, tokens: list[int]) -> str:
        self._supervisor.current()
        check_token_ids(tokens, self._vocab, "tokens")
        return str(await self._tokenizing.run(self._tokenizer.decode, tokens))

    async def abort(self, request_id: str) -> bool:
        """Also tells AsyncLLM, which holds the request in its own queue and batch."""
        known = await super().abort(request_id)
        llm = self._supervisor.llm
        if known and llm is not None:
            await llm.abort(request_id)
        return known

    # -- generation -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._supervisor.current()
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
        setup = self._thinking
        markers = setup.markers
        ids, thinking = await self._tokenizing.run(
            prompt_ids, self._tokenizer, request, self._vocab, setup.thinks, setup.gated
        )
        ids = truncate_prompt(ids, request.sampling.truncate_prompt_tokens, self._context)
        budget = vllm_thinking_budget(thinking, ids, setup.start_ids)
        extra = thinking_args(thinking, *markers, setup.eos) if markers is not None else None
        params = generate_params(request, ids, self._context, self._vocab, budget, extra)
        # A grammar starts at once unless the output begins in thinking (then after `</think>`).
        reasoning_ended = not setup.gated or not starts_thinking(thinking)
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
        llm = self._supervisor.current()
        if self._embedding or not self._kwargs.get("enable_lora"):
            raise BadRequestError(
                f"LoRA adapter `{name}`: this model was started without LoRA (a generation model "
                "with `engine: {enable_lora: true}` or `adapters:` takes them).",
                param="lora_name",
            )
        await self._adapters.load(llm, name, path)

    async def unload_adapter(self, name: str) -> None:
        await self._adapters.unload(self._supervisor.current(), name)

    # -- embeddings and rerank (pooling.py) ---------------------------------------------------

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        llm = self._supervisor.current()
        if not self._embedding or self._rank:
            raise BadRequestError("This model does not serve embeddings.", param="model")
        seqs = await self._tokenizing.run(
            pooling.embed_ids, self._tokenizer, request.inputs, self._context, self._vocab
        )
        self._stats.requests_total += 1
        return await pooling.embed(llm, request.request_id, seqs)

    async def rank(self, request: RankRequest) -> RankResult:
        """Raw classifier logits (no activation: the gateway applies it), all pairs at once."""
        llm = self._supervisor.current()
        if not self._rank:
            raise BadRequestError("This model does not serve rerank.", param="model")
        inputs = await self._tokenizing.run(pooling.pair_inputs, self._tokenizer, request, self._context)
        self._stats.requests_total += 1
        return await pooling.rank(llm, request.request_id, inputs)
