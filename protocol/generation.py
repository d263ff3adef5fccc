"""Engine-neutral request and delta types: what crosses the Ray hop between gateway and replica.

They are plain slotted dataclasses rather than pydantic models because one is pickled per token
batch on the hot path; the pydantic request models in `chat.py` / `completions.py` are the wire
format and map onto these with `to_sampling_params()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort", "tool_calls"]
ToolChoiceMode = Literal["none", "auto", "required", "function"]


@dataclass(slots=True)
class SamplingParams:
    """What an engine needs to decode; `None` means "the engine's OpenAI-compatible default"."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    # Keep only the k likeliest tokens (vLLM's convention: None, 0 and -1 all mean "off").
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Log-probabilities of the sampled tokens: None = none; k >= 0 = also the k likeliest tokens.
    logprobs: int | None = None
    # The same for the prompt tokens (completions `echo` + `logprobs`); the first token has none.
    prompt_logprobs: int | None = None
    # Added to the logits of these token ids before sampling (OpenAI's -100..100 scale).
    logit_bias: dict[int, float] | None = None
    # Constrain the output to JSON that validates against this schema (`{"type": "object"}` for
    # response_format json_object): a grammar on llama.cpp, guided decoding on vLLM.
    json_schema: dict[str, Any] | None = None
    # vLLM's extensions (protocol/extensions.py), with vLLM's meaning and "off" values.
    min_p: float = 0.0  # keep tokens at least this likely relative to the likeliest
    repetition_penalty: float = 1.0  # > 1 discourages tokens seen in the prompt or output
    min_tokens: int = 0  # end-of-generation and `stop_token_ids` are banned until this many
    ignore_eos: bool = False  # end-of-generation tokens are banned: only the budget ends it
    stop_token_ids: list[int] = field(default_factory=list)  # finish "stop" on one of these
    include_stop_str_in_output: bool = False  # keep the stop string / stop token in the text
    skip_special_tokens: bool = True  # special tokens' text left out of the output
    truncate_prompt_tokens: int | None = None  # keep the last k prompt tokens (-1: the context)
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] = field(default_factory=list)  # never completed in the output
    # The other output constraints (at most one of these and `json_schema` is set): a regular
    # expression the whole output matches, one of fixed strings, or a GBNF grammar.
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    @property
    def top_k_limit(self) -> int | None:
        """`top_k` as a positive count, or None when it is off."""
        return self.top_k if self.top_k is not None and self.top_k > 0 else None

    @property
    def constrained(self) -> bool:
        """Whether a grammar of some kind constrains the whole output."""
        return any(c is not None for c in (self.json_schema, self.regex, self.choice, self.grammar))


@dataclass(slots=True)
class ToolCall:
    """A call the assistant made in an earlier turn (`arguments` is the JSON text, as on the wire)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ImageInput:
    """An image a client sent, already fetched, decoded and checked against the model's limits by
    the gateway, so the replica never sees a file that is not an image or is too big.

    `data` stays the encoded bytes (PNG, JPEG, ...) rather than pixels: an order of magnitude less to
    pickle across the Ray hop, and what llama.cpp's mtmd and vLLM's processors take. `digest` (sha256
    of `data`, hex) is the key the prompt cache and affinity routing use, as llama-server keys its
    cache by image hash.
    """

    data: bytes
    digest: str
    width: int
    height: int
    format: str  # PIL's format name: PNG, JPEG, WEBP, GIF, BMP


@dataclass(slots=True)
class ChatMessage:
    """A chat turn, ready for the model's chat template.

    `content` is the turn's text. A turn with images also has `parts`: its text and images in the
    order the client sent them (text parts joined as in `content`); engines without vision never get
    one (the gateway refuses it with a 400 naming the model).
    """

    role: str
    content: str
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    parts: tuple[str | ImageInput, ...] = ()

    @property
    def images(self) -> tuple[ImageInput, ...]:
        return tuple(p for p in self.parts if isinstance(p, ImageInput))


@dataclass(slots=True)
class FunctionTool:
    """A function the model may call; `parameters` is its arguments' JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


@dataclass(slots=True)
class ToolsSpec:
    """`tools` + `tool_choice` + `parallel_tool_calls`, normalised.

    `choice` is `function` when one named function is forced (`name` says which). `required` and
    `function` must constrain the output so that a call is made, not merely ask for one.
    """

    tools: list[FunctionTool]
    choice: ToolChoiceMode = "auto"
    name: str | None = None
    parallel: bool = True

    def offered(self) -> list[FunctionTool]:
        """The tools a call may use: all of them, or the forced one."""
        if self.choice == "function":
            return [t for t in self.tools if t.name == self.name]
        return list(self.tools) if self.choice != "none" else []


@dataclass(frozen=True, slots=True)
class TraceCarrier:
    """The caller's trace, carried across the Ray hop so the replica's spans join it.

    `traceparent` / `tracestate` are the W3C headers of the gateway's span for this engine call.
    The exporter settings travel with them because a replica actor is started by the controller,
    not by the gateway whose `--otlp-traces-endpoint` was set: the request is the one thing that
    reaches it from that gateway. None on a request (the default) means tracing is off: the replica
    does nothing for it.
    """

    traceparent: str
    tracestate: str
    endpoint: str
    protocol: str
    service_name: str


@dataclass(slots=True)
class GenerateRequest:
    """One sequence to generate. Exactly one of `prompt` / `messages` is set.

    `prompt` may be text or token ids (the completions API accepts both). `request_id` is the handle
    `abort()` takes.
    """

    request_id: str
    sampling: SamplingParams
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None
    tools: ToolsSpec | None = None
    # Completions `suffix`: fill in the middle between `prompt` and `suffix` (needs FIM tokens).
    suffix: str | None = None
    # LoRA adapters to decode under, by name (`adapters:` of the model's spec) with their scales;
    # empty: the base model alone. A tuple, so an engine can key its prompt cache by it.
    lora: tuple[tuple[str, float], ...] = ()
    # Thinking on a reasoning model (docs/reasoning.md). `thinking`: the per-request switch that
    # every API maps onto (chat's `chat_template_kwargs.enable_thinking` and `reasoning_effort`,
    # Responses' `reasoning.effort`, Anthropic's `thinking.type`, Ollama's `think`); None leaves
    # it to the chat template. It reaches the template as `enable_thinking`. `thinking_budget`:
    # thinking tokens before the engine forces the end marker (None: the model's default).
    thinking: bool | None = None
    thinking_budget: int | None = None
    # Other keyword arguments for the chat template (vLLM's `chat_template_kwargs`).
    template_kwargs: dict[str, Any] | None = None
    # False: the thinking is generated but left out of the output (vLLM's `include_reasoning`).
    include_reasoning: bool = True
    # The OpenTelemetry trace this engine call belongs to (None: tracing off; docs/tracing.md).
    trace: TraceCarrier | None = None
    # Scheduling class inside the engine (`rank`): vLLM's `priority` (lower first), and whether the
    # sequence is a batch line (`/v1/batches`), a class below every interactive request whatever
    # its `priority`. The batched llama.cpp engine admits waiting sequences in this order and
    # preempts a running batch line for an interactive sequence that finds no free slot.
    priority: int = 0
    background: bool = False

    @property
    def rank(self) -> tuple[bool, int]:
        """The engine's scheduling order: interactive before batch, then `priority`."""
        return (self.background, self.priority)

    def chat_template_kwargs(self) -> dict[str, Any]:
        """What the chat template is rendered with besides the messages."""
        kwargs = dict(self.template_kwargs or {})
        if self.thinking is not None:
            kwargs["enable_thinking"] = self.thinking
        return kwargs

    @property
    def prompt_param(self) -> str:
        """The request field a context-length error points at, as OpenAI names it."""
        return "messages" if self.messages is not None else "prompt"


@dataclass(slots=True)
class TopLogprob:
    """One likely alternative at a token position, as an engine reports it; `token_bytes` are raw since a
    token may hold part of a UTF-8 character."""

    token: str
    token_bytes: bytes
    logprob: float


@dataclass(slots=True)
class TokenLogprob:
    """One token: its text, raw bytes (a token may hold half a UTF-8 character), its
    log-probability under the model, and the likeliest alternatives, most likely first.
    `logprob` is None only for the first prompt token, which nothing predicts."""

    token: str
    token_bytes: bytes
    logprob: float | None
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of a tool call. The first piece of call `index` carries `id` and `name`; later
    pieces only append to `arguments` (the way OpenAI streams them)."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class Delta:
    """A piece of generated text. The last delta of a sequence has `finish_reason` set.

    `prompt_tokens` / `completion_tokens` are the engine's own running counts, so usage is exact
    without re-tokenising anything in the gateway. `logprobs` covers the tokens generated since
    the previous delta (text may lag behind them while a stop string is undecided);
    `prompt_logprobs` arrives once, on the first delta, when it was asked for. A delta with
    nothing in it says tokens came whose text is not out yet (backends/engines/deltas.py): OpenAI
    streams send it as an empty chunk, the other APIs send nothing for it.
    """

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCallDelta] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    # The stop string that ended the sequence (finish_reason `stop`; None: end of generation).
    # Anthropic's Messages API reports it as `stop_sequence`.
    stop_sequence: str | None = None
    # Prompt tokens served from the engine's prefix cache (None: the engine does not say).
    cached_tokens: int | None = None
    # A reasoning model's thinking, split from `text` (the answer) by the engine's reasoning
    # parser (backends/engines/reasoning.py); `reasoning_tokens` is its running token count,
    # None for a model without a `reasoning:` block.
    reasoning: str = ""
    reasoning_tokens: int | None = None
    # When the sequence entered the engine's queue and when it left it for a slot (Unix seconds,
    # the replica's clock), once it has one (None: the engine does not say). Traces split the
    # engine's queue from the prefill with it (backends/cluster/routing/replica_trace.py).
    queued: tuple[float, float] | None = None


@dataclass(slots=True)
class EmbedRequest:
    """A batch to embed: texts, or token-id lists (both are valid OpenAI `input`)."""

    request_id: str
    inputs: list[str] | list[list[int]]
    # The OpenTelemetry trace of the call (None: tracing off), as on `GenerateRequest`.
    trace: TraceCarrier | None = None


@dataclass(slots=True)
class EmbedResult:
    """Unit-normalised vectors in input order, and the tokens they consumed."""

    embeddings: list[list[float]]
    prompt_tokens: int


@dataclass(slots=True)
class RankRequest:
    """Text pairs for a cross-encoder (`task: rerank`): one relevance logit per (query, document).
    `param` names the request field an over-long pair is blamed on (`documents`, `text_2`)."""

    request_id: str
    pairs: list[tuple[str, str]]
    param: str = "documents"
    # The OpenTelemetry trace of the call (None: tracing off), as on `GenerateRequest`.
    trace: TraceCarrier | None = None


@dataclass(slots=True)
class RankResult:
    """Raw logits in pair order (the serving layer applies the activation), and the tokens the
    pairs consumed."""

    scores: list[float]
    prompt_tokens: int


@dataclass(slots=True)
class TokenizeRequest:
    """vLLM's `/tokenize`: text (`prompt`) or chat `messages` rendered by the model's template."""

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    tools: ToolsSpec | None = None
    # As `GenerateRequest.thinking`: the prompt a generate request with this switch would see
    # (Anthropic's count_tokens counts what its create would, thinking off unless enabled).
    thinking: bool | None = None


@dataclass(slots=True)
class TokenizeResult:
    """What a replica returns for `/tokenize`: the ids, their text pieces, and the context length the response
    reports as `max_model_len`."""

    tokens: list[int]
    token_strs: list[str]
    max_model_len: int
