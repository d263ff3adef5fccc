"""A loaded GGUF and the prompt side of a request: what both llama.cpp engines share.

The one-sequence engine (`engine.py`) and the batched one (`batched.py`) differ only in how they
decode. Everything before the first decode is here, once, so the two cannot drift apart: loading
the model, the chat template, fill-in-the-middle, token-id prompts, the context-length check, the
sampler, and tokenize/detokenize. Each engine holds a `LlamaModel` (composition): neither reaches
into the other.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from raygate.backends.engines import reasoning, tool_calls
from raygate.backends.engines.base import check_token_ids, completion_budget, truncate_prompt
from raygate.backends.engines.cpu_cores import thread_count
from raygate.backends.engines.images import has_images, place_images
from raygate.backends.engines.llama_cpp import sampling as sampling_lib
from raygate.backends.engines.llama_cpp import vision as vision_lib
from raygate.backends.engines.llama_cpp.options import check_llama_options
from raygate.protocol.capabilities import ReasoningConfig
from raygate.protocol.errors import BadRequestError, EngineError, OpenAIError, UnsupportedParameterError
from raygate.protocol.generation import (
    ChatMessage,
    GenerateRequest,
    ImageInput,
    TokenizeRequest,
    TokenizeResult,
    ToolsSpec,
)

# Defaults chosen for a shared CPU box: one thread per replica keeps generation steady when other
# replicas run (with 2 threads it collapses 5-8x under contention, measured on 2 cores).
DEFAULT_ENGINE_KWARGS: dict[str, Any] = {"n_ctx": 2048, "n_threads": 1}

# KV-cache element types by llama-server's names (`-ctk` / `-ctv`): ggml's `ggml_type` numbers,
# which `Llama(type_k=, type_v=)` takes.
KV_CACHE_TYPES: dict[str, int] = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30,
}  # fmt: skip

# Generation only (not embeddings): llama.cpp's flash attention, which llama-server turns on for a
# CPU (`-fa auto`; `Llama` leaves it off): a decode step of 8 sequences 10-20 % shorter on 2 cores.
# Its V cache in Q8_0, not llama-server's F16: half V's memory (-85 MB RSS at 8 x 2048 tokens of
# SmolLM2) at no cost in speed; the model's perplexity on README.md moved by 0.01 %. That greedy
# answers do not depend on the prompt cache (how a prompt was cut into decodes) comes from Raygate's
# llama.cpp build, which runs one flash-attention kernel for every batch, whatever V's type
# (scripts/llama_cpp/0002-*.patch; docs/configuration.md).
GENERATION_DEFAULTS: dict[str, Any] = {"flash_attn": True, "type_v": "q8_0"}


# Host memory for copies of evicted prompt-cache slots (`prompt_store.py`), per batched replica.
DEFAULT_PROMPT_CACHE_RAM_MIB = 128.0
MAX_PROMPT_CACHE_RAM_MIB = 2**20


@dataclass(frozen=True, slots=True)
class PromptCacheSettings:
    """Our own `engine:` keys (not llama.cpp's): `prompt_cache` (reuse cached prefixes, default
    true) and `prompt_cache_ram_mib` (host memory for slots' states, batched engine only; None:
    not set)."""

    enabled: bool
    ram_mib: float | None

    @property
    def ram_bytes(self) -> int:
        mib = DEFAULT_PROMPT_CACHE_RAM_MIB if self.ram_mib is None else self.ram_mib
        return int(mib * 2**20) if self.enabled else 0


def llama_kwargs(
    engine_kwargs: dict[str, Any], *, generation: bool
) -> tuple[dict[str, Any], PromptCacheSettings]:
    """The `engine:` settings as `Llama(...)` takes them, and the prompt cache's own.
    A generation model gets `GENERATION_DEFAULTS` under its own settings; the quantized V cache
    only with flash attention (llama.cpp refuses it without).
    `n_threads` / `n_threads_batch` may be `auto`: the cores the replica's process may use
    (`cpu_cores.usable_cores`), as llama-server's `-t` defaults to the machine's cores; right for
    one replica per node (several on one node would each take them all). `auto-N` leaves N of
    them out. llama.cpp runs a decode of one token (one sequence) on `n_threads` and any larger
    batch (prompts, several sequences) on `n_threads_batch`.

    Prefill gets as many threads as decoding unless `n_threads_batch` says otherwise:
    llama-cpp-python's own default is half the machine's cores, which left prefill on one thread
    of a two-thread replica (llama-server's `-tb` defaults to `-t` too)."""
    check_llama_options(engine_kwargs)
    kwargs = {**DEFAULT_ENGINE_KWARGS, **engine_kwargs}
    if generation:
        kwargs.setdefault("flash_attn", GENERATION_DEFAULTS["flash_attn"])
        if kwargs["flash_attn"]:
            kwargs.setdefault("type_v", GENERATION_DEFAULTS["type_v"])
    for key in ("type_k", "type_v"):
        if key in kwargs:
            kwargs[key] = kv_cache_type(key, kwargs[key])
    ram = kwargs.pop("prompt_cache_ram_mib", None)
    number = isinstance(ram, int | float) and not isinstance(ram, bool)
    if ram is not None and not (number and 0 <= ram <= MAX_PROMPT_CACHE_RAM_MIB):
        raise ValueError(
            f"engine.prompt_cache_ram_mib must be MiB from 0 to {MAX_PROMPT_CACHE_RAM_MIB}, not {ram!r}"
        )
    cache = PromptCacheSettings(bool(kwargs.pop("prompt_cache", True)), None if ram is None else float(ram))
    for key in ("n_threads", "n_threads_batch"):
        if key in kwargs:
            kwargs[key] = thread_count(kwargs[key])
    kwargs.setdefault("n_threads_batch", kwargs["n_threads"])
    return kwargs, cache


def kv_cache_type(key: str, value: Any) -> int:
    """`type_k` / `type_v` by llama-server's name (`q8_0`) or ggml's number (8)."""
    if isinstance(value, str) and value.lower() in KV_CACHE_TYPES:
        return KV_CACHE_TYPES[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in KV_CACHE_TYPES.values():
        return value
    raise ValueError(f"engine.{key} must be one of {', '.join(KV_CACHE_TYPES)}, not {value!r}")


@dataclass(slots=True)
class Prepared:
    """A generation request ready for decoding: its prompt ids, its completion budget, its
    sampler (which the decoder closes when the sequence ends), a reasoning model's thinking, and
    the prompt's images (`vision.py`: their pseudo ids are in `prompt`)."""

    prompt: list[int]
    budget: int
    sampler: sampling_lib.TokenSampler
    thinking: reasoning.ThinkingPlan | None = None
    images: tuple[vision_lib.ImageSpan, ...] = ()


class LlamaModel:
    """A `Llama` object (tokenizer, vocabulary, chat template; its own context serves the
    one-sequence engine) and the request-side work on it."""

    def __init__(self, llm: Any, formatter: Any, thinks: reasoning.ReasoningFormat | None = None) -> None:
        self.llm = llm
        self._formatter = formatter
        self.reasoning = thinks
        # A vision model's mtmd context (`vision.Projector`), set by the batched engine; the
        # model's name, for the 400 that refuses images to a text-only one.
        self.projector: vision_lib.Projector | None = None
        self.name = "this model"

    @classmethod
    def load(
        cls,
        model_path: str,
        *,
        embedding: bool,
        kwargs: dict[str, Any],
        reasoning_config: ReasoningConfig | None = None,
    ) -> LlamaModel:
        """Blocking (seconds): run it on the thread that will own the context."""
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        kwargs = dict(kwargs)
        # `chat_template` (engine option): a Jinja template for a GGUF that carries none, or to
        # replace its own (Xinference's prompt styles arrive this way, protocol/xinference.py).
        override = kwargs.pop("chat_template", None)
        llm = Llama(model_path=model_path, embedding=embedding, **kwargs)
        formatter = None
        template = None if embedding else (override or llm.metadata.get("tokenizer.chat_template"))
        if template:
            model = llm._model
            formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=model.token_get_text(llm.token_eos()),
                bos_token=model.token_get_text(llm.token_bos()),
            )
        return cls(llm, formatter, reasoning.resolve(reasoning_config, template))

    # -- prompts ------------------------------------------------------------------------------

    def render_chat(
        self,
        messages: list[ChatMessage],
        tools: ToolsSpec | None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        text, added_special = self.render_chat_text(messages, tools, add_generation_prompt, template_kwargs)
        return self.tokenize_prompt(text, added_special)

    def tokenize_prompt(self, text: str, added_special: bool) -> list[int]:
        return list(self.llm.tokenize(text.encode(), add_bos=not added_special, special=True))

    def render_chat_text(
        self,
        messages: list[ChatMessage],
        tools: ToolsSpec | None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, bool]:
        """The rendered prompt, and whether the template wrote the special tokens itself.
        `template_kwargs`: extra template variables (`enable_thinking`, vLLM's
        `chat_template_kwargs`)."""
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
            rendered = formatter(
                messages=tool_calls.render_messages(messages, tools), **(template_kwargs or {})
            )
        except Exception as exc:
            raise BadRequestError(f"Chat template rejected the messages: {exc}", param="messages") from None
        return rendered.prompt, bool(rendered.added_special)

    def prompt_tokens(self, request: GenerateRequest) -> list[int]:
        """Blocking: tokenizers and Jinja templates are CPU work."""
        return self.prompt_and_thinking(request)[0]

    def prompt_and_thinking(
        self, request: GenerateRequest
    ) -> tuple[list[int], reasoning.ThinkingPlan | None]:
        """The prompt's tokens, and for a chat with a reasoning model, its thinking: where the
        prompt leaves it (thinking switched off is closed here when the template cannot), the
        budget, and the end marker's tokens."""
        tokens, plan, _ = self.prompt_parts(request)
        return tokens, plan

    def prompt_parts(
        self, request: GenerateRequest
    ) -> tuple[list[int], reasoning.ThinkingPlan | None, tuple[vision_lib.ImageSpan, ...]]:
        """`prompt_and_thinking`, and the prompt's image spans (`vision.py`; their pseudo ids are
        among the tokens). Blocking: images are decoded and resized here."""
        if request.messages is None:
            return self._plain_prompt(request), None, ()
        messages, images = self._place_images(request.messages)
        text, special = self.render_chat_text(
            messages, request.tools, template_kwargs=request.chat_template_kwargs()
        )
        thinks = self.reasoning
        plan = None
        if thinks is not None:
            if request.thinking is False and reasoning.can_disable(thinks.parser):
                text += reasoning.closing_text(text, thinks.parser)
            marker = reasoning.end_marker(thinks.parser)
            end = list(self.llm.tokenize(marker.encode(), add_bos=False, special=True))
            plan = reasoning.ThinkingPlan(
                thinks.parser,
                reasoning.prompt_state(text, thinks.parser),
                thinks.budget_for(request.thinking_budget),
                end,
                request.include_reasoning,
            )
        if not images:
            return self.tokenize_prompt(text, special), plan, ()
        assert self.projector is not None  # `_place_images` refused images otherwise
        tokens, spans = self.projector.tokenize(text, not special, images)
        if spans and spans[-1].end == len(tokens):
            # Never from a chat template with a generation prompt; the decoder samples after text.
            raise BadRequestError("The prompt must not end with an image.", param="messages")
        return tokens, plan, spans

    def _place_images(self, messages: list[ChatMessage]) -> tuple[list[ChatMessage], list[ImageInput]]:
        """The turns with their images replaced by the projector's media marker (where mtmd puts
        each image's tokens), and the images in prompt order. A text-only model refuses images
        with the 400 the gateway gives first (defence in depth: a request that reached the
        replica another way)."""
        if not has_images(messages):
            return messages, []
        if self.projector is None:
            raise BadRequestError(
                f"Model `{self.name}` does not accept images: it has no `vision:` block with a projector.",
                param="messages",
            )
        return place_images(messages, self.projector.marker)

    def _plain_prompt(self, request: GenerateRequest) -> list[int]:
        if isinstance(request.prompt, list):
            check_token_ids(request.prompt, self.llm.n_vocab(), "prompt")
            if request.suffix is not None:
                raise UnsupportedParameterError("`suffix` needs a text prompt.", param="suffix")
            return list(request.prompt)
        if request.suffix is not None:
            return self.fill_in_middle(request.prompt or "", request.suffix)
        return list(self.llm.tokenize((request.prompt or "").encode(), add_bos=True, special=False))

    def fill_in_middle(self, prefix: str, suffix: str) -> list[int]:
        """Prefix-suffix-middle order with the model's own FIM tokens (as llama.cpp's server)."""
        import llama_cpp

        llm = self.llm
        vocab = llm._model.vocab
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
        tokenize = llm.tokenize
        bos = [llm.token_bos()] if llm._model.add_bos_token() else []
        return [
            *bos,
            pre,
            *tokenize(prefix.encode(), add_bos=False, special=False),
            suf,
            *tokenize(suffix.encode(), add_bos=False, special=False),
            mid,
        ]

    async def prepare(self, request: GenerateRequest, context_length: int) -> Prepared:
        """Everything a decoder needs, refused (with a 400) before anything is streamed: the
        prompt, the context-length check, and the sampler. Built off the engine thread: grammar
        compilation reads only the (immutable) vocabulary. One trip to a worker thread for both:
        each trip is a thread wake-up and a loop wake-up (~0.2 ms on two busy cores)."""
        return await asyncio.to_thread(self._prepare, request, context_length)

    def _prepare(self, request: GenerateRequest, context_length: int) -> Prepared:
        tokens, thinking, images = self.prompt_parts(request)
        kept = truncate_prompt(tokens, request.sampling.truncate_prompt_tokens, context_length)
        if images:
            images, kept = vision_lib.truncated(images, tokens, len(kept))
            if request.sampling.prompt_logprobs is not None:
                raise UnsupportedParameterError(
                    "No prompt logprobs for a prompt with images.", param="messages"
                )
        tokens = kept
        budget = completion_budget(request, len(tokens), context_length)
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(32)
        history = vision_lib.text_tokens(tokens) if images else tokens
        sampler = sampling_lib.build_sampler(
            self.llm, request.sampling, request.tools, seed, history, context_length
        )
        return Prepared(tokens, budget, sampler, thinking, images)

    # -- tokenizer endpoints ------------------------------------------------------------------

    def tokenize(self, request: TokenizeRequest, context_length: int) -> TokenizeResult:
        """Blocking. vLLM's `/tokenize`: ids and the text of each."""
        llm = self.llm
        if request.messages is not None:
            switch = None if request.thinking is None else {"enable_thinking": request.thinking}
            text, special = self.render_chat_text(
                request.messages, request.tools, request.add_generation_prompt, switch
            )
            thinks = self.reasoning
            if (
                thinks is not None
                and request.thinking is False
                and request.add_generation_prompt
                and reasoning.can_disable(thinks.parser)
            ):
                text += reasoning.closing_text(text, thinks.parser)
            tokens = self.tokenize_prompt(text, special)
        else:
            add_bos = request.add_special_tokens and bool(llm._model.add_bos_token())
            tokens = llm.tokenize((request.prompt or "").encode(), add_bos=add_bos, special=False)
        strs = [
            bytes(llm._model.detokenize([t], special=True)).decode("utf-8", errors="replace") for t in tokens
        ]
        return TokenizeResult(list(tokens), strs, context_length)

    async def detokenize(self, tokens: list[int]) -> str:
        check_token_ids(tokens, self.llm.n_vocab(), "tokens")
        raw = await asyncio.to_thread(self.llm.detokenize, tokens)
        return bytes(raw).decode("utf-8", errors="replace")

    async def count_tokens(self, text: str) -> int:
        tokens = await asyncio.to_thread(self.llm.tokenize, text.encode(), False, False)
        return len(tokens)


def decode_error(exc: BaseException) -> OpenAIError:
    """What a request sees when its decode fails: a 400 stays one (a grammar that allows no token
    for this request, say); anything else is the engine's failure."""
    if isinstance(exc, BadRequestError):
        return exc
    return EngineError(f"llama.cpp failed: {exc}")
