"""Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, ...): request and response models,
and the translation of a request into the OpenAI body the one serving layer already runs.

There is one generation path: an Ollama chat becomes a `ChatCompletionRequest`, a `raw` or
`suffix` generate a `CompletionRequest`, a templated generate a chat of one user turn (after the
`system` turn), so templates, tool grammars, structured output, stop strings and the model's
`defaults:` behave the same on both APIs. A field is set on the OpenAI body only when the Ollama
request set it: the model's defaults fill the rest exactly as on `/v1`.

What Ollama spells differently is mapped here, once:

- `options.num_predict` is `max_tokens` (-1 and -2, "until done" and "fill the context", are
  unset), `repeat_penalty` is `repetition_penalty`; `temperature`, `top_k`, `top_p`, `min_p`,
  `seed`, `stop`, `presence_penalty`, `frequency_penalty` keep their names;
- `options.num_ctx` asks for a context: up to the model's own it is honoured as it is (the engine's
  context is fixed at load), above it is a 400 (checked in the serving layer, which knows it);
- options that configure Ollama's runner (`num_gpu`, `num_thread`, `use_mmap`, ...) are accepted
  with no effect (a deployment's `engine:` configures Raygate's); sampling options no engine here
  implements (`mirostat`, `tfs_z`, `typical_p` at other than their "off" values) are a 400 naming them;
- `format: "json"` is any JSON object, a schema dict constrains to that schema (chat's
  `response_format`);
- `tools` are OpenAI's function tools; a call's `arguments` are an object both ways (OpenAI's
  `tool_choice` is taken too, Raygate's extension: Ollama's own calls are always `auto`);
- `think` is the chat body's thinking switch (docs/reasoning.md): `true` is
  `chat_template_kwargs: {enable_thinking: true}`, `false` the same set to false, `"low"`,
  `"medium"`, `"high"` are `reasoning_effort` (on, within that effort's budget); unset leaves the
  model's default. The thinking comes back as `message.thinking` (`thinking` on `/api/generate`),
  the answer alone in `content` / `response`. Asking a model without a `reasoning:` block to think
  is Ollama's 400, `"NAME" does not support thinking` (checked in the serving layer, which knows
  the model); `raw` and `suffix` bypass the template that switches thinking, so they take only
  `think: false`;
- `images` (base64, on a chat turn or on `/api/generate`) become `image_url` parts ahead of the
  turn's text, as Ollama places them; each keeps its own field path (`messages[0].images[1]`) for
  the error that names it. A model without a `vision:` block refuses them as Ollama does,
  `"NAME" does not support images` (checked in the serving layer, which knows the model).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator

from raygate.protocol.base import NestedOmitsNone, RequestModel, ResponseModel
from raygate.protocol.chat import ChatCompletionRequest, ChatMessageIn, ContentPart, ImageURL
from raygate.protocol.completions import CompletionRequest
from raygate.protocol.embeddings import EmbeddingRequest
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import TokenLogprob
from raygate.protocol.tools import (
    MAX_TOOLS,
    MIN_LOGPROB,
    FunctionCallIn,
    FunctionDefinition,
    ToolCallIn,
    ToolChoice,
    ToolDefinition,
)

# What `GET /api/version` reports: the Ollama release whose API this follows (clients compare it
# to decide which fields they may send).
OLLAMA_API_VERSION = "0.12.6"

# Sampling options with no engine here, and the value at which each is "off" (accepted).
_UNSUPPORTED_OPTIONS: dict[str, float] = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}


class OllamaError(BadRequestError):
    """A 400 worded as Ollama words it (the `error` string is all its clients show)."""


class OllamaErrorResponse(ResponseModel):
    """Ollama's error body on every `/api/` route: the message, and nothing else."""

    error: str


class Options(RequestModel):
    """`options`: Ollama's Modelfile parameters for one request. Every field may be null (LangChain
    sends its unset ones so)."""

    # Sampling: honoured.
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: int | None = Field(None, ge=-1)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    num_predict: int | None = Field(None, ge=-2)
    stop: list[str] | None = None
    seed: int | None = None
    repeat_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    num_ctx: int | None = Field(None, ge=1)
    # Sampling with no engine here: a 400 unless at the "off" value.
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    tfs_z: float | None = None
    typical_p: float | None = None
    # The penalty window and newline penalty: the engines penalise the whole sequence.
    repeat_last_n: int | None = None
    penalize_newline: bool | None = None
    # Ollama's runner (how a model is loaded): a deployment's `engine:` decides here.
    num_keep: int | None = None
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    num_thread: int | None = None
    embedding_only: bool | None = None
    logits_all: bool | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def refused(self) -> list[str]:
        """`options.<name>` of the sampling options set to something no engine here does."""
        return [
            f"options.{name}"
            for name, off in _UNSUPPORTED_OPTIONS.items()
            if getattr(self, name) is not None and getattr(self, name) != off
        ]

    def sampling(self) -> dict[str, Any]:
        """The OpenAI body's fields these options set (and only those)."""
        out: dict[str, Any] = {}
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "presence_penalty",
            "frequency_penalty",
        ):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.num_predict is not None and self.num_predict > 0:
            out["max_tokens"] = self.num_predict
        elif self.num_predict == 0:
            raise OllamaError("`options.num_predict` must be positive (or -1: until done).", param="options")
        if self.repeat_penalty is not None:
            out["repetition_penalty"] = self.repeat_penalty
        stops = [s for s in self.stop or () if s]
        if stops:
            out["stop"] = stops
        return out


class ToolFunctionCall(RequestModel):
    """A call's function: Ollama sends `arguments` as an object (a JSON string is taken too)."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCallItem(RequestModel):
    """One entry of an assistant message's `tool_calls`, as the client sends history back."""

    id: str | None = None
    function: ToolFunctionCall


class OllamaMessage(RequestModel):
    """A chat turn: `images` ride on the turn, `tool_name` names the tool a `tool` turn answers."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    thinking: str | None = None


class Tool(RequestModel):
    """A function tool, OpenAI's shape (the client leaves `type` at `function`)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


Format = Literal["", "json"] | dict[str, Any]
KeepAlive = float | str


class _Generating(RequestModel):
    """What `/api/chat` and `/api/generate` share."""

    model: str = Field(min_length=1)
    stream: bool = True
    format: Format | None = None
    options: Options | None = None
    keep_alive: KeepAlive | None = None
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def _common(self, model_id: str) -> dict[str, Any]:
        """The OpenAI fields every translation sets: the model, sampling, format, logprobs."""
        options = self.options or Options()
        refused = options.refused()
        if refused:
            raise OllamaError(f"`{refused[0]}` is not supported by this server.", param=refused[0])
        fields: dict[str, Any] = {"model": model_id, "stream": self.stream, **options.sampling()}
        # Plain data: validated with the rest of the OpenAI body (a refusal is a 400, `openai_body`).
        if self.format == "json":
            fields["response_format"] = {"type": "json_object"}
        elif isinstance(self.format, dict):
            fields["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "format", "schema": self.format},
            }
        return fields

    def thinks(self) -> bool:
        """Whether the request asks for thinking (`true` or a level), not merely allows it."""
        return self.think not in (None, False)

    def _thinking(self) -> dict[str, Any]:
        """The chat body's thinking fields `think` sets: the switch, or an effort (its budget)."""
        if isinstance(self.think, bool):
            return {"chat_template_kwargs": {"enable_thinking": self.think}}
        if self.think is not None:
            return {"reasoning_effort": self.think}
        return {}

    @property
    def num_ctx(self) -> int | None:
        return self.options.num_ctx if self.options else None


def openai_body(
    cls: type[ChatCompletionRequest] | type[CompletionRequest] | type[EmbeddingRequest],
    fields: dict[str, Any],
) -> Any:
    """The OpenAI body, validated as `/v1` validates it; a refusal is a 400 in Ollama's words."""
    try:
        return cls.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise OllamaError(f"invalid request: {where}: {first.get('msg', 'invalid value')}") from None


class ChatRequest(_Generating):
    """`POST /api/chat`. No `messages` (or none) only loads the model, as in Ollama."""

    messages: list[OllamaMessage] | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    # Raygate's extension (Ollama has none): OpenAI's `tool_choice`, to force a call.
    tool_choice: ToolChoice | None = None

    def images(self) -> bool:
        return any(m.images for m in self.messages or ())

    def to_openai(self, model_id: str) -> ChatCompletionRequest:
        fields = {**self._common(model_id), **self._thinking()}
        fields["messages"] = chat_messages(self.messages or [])
        if self.tools:
            fields["tools"] = [ToolDefinition(type="function", function=t.function) for t in self.tools]
        if self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        if self.logprobs:
            fields["logprobs"] = True
            fields["top_logprobs"] = self.top_logprobs
        result: ChatCompletionRequest = openai_body(ChatCompletionRequest, fields)
        return result


def chat_messages(messages: list[OllamaMessage]) -> list[ChatMessageIn]:
    """Ollama's turns as OpenAI's. Ollama's calls carry no ids and its `tool` turns name the tool
    (`tool_name`), not the call: each call gets an id, and each tool turn the id of the oldest
    unanswered call of that name (or, unnamed, the oldest unanswered call)."""
    out: list[ChatMessageIn] = []
    pending: list[tuple[str, str]] = []  # (call id, function name), oldest first
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                pending.append((call_id, call.function.name))
                arguments = call.function.arguments
                text = arguments if isinstance(arguments, str) else json.dumps(arguments)
                calls.append(
                    ToolCallIn(id=call_id, function=FunctionCallIn(name=call.function.name, arguments=text))
                )
            out.append(ChatMessageIn(role="assistant", content=m.content or "", tool_calls=calls))
        elif m.role == "tool":
            match = next((p for p in pending if m.tool_name in (None, p[1])), None)
            if match is not None:
                pending.remove(match)
            call_id = m.tool_call_id or (match[0] if match else f"call_{i}")
            out.append(
                ChatMessageIn(role="tool", content=m.content or "", tool_call_id=call_id, name=m.tool_name)
            )
        elif m.images:
            out.append(
                ChatMessageIn(role=m.role, content=image_parts(m.images, f"messages[{i}].images", m.content))
            )
        else:
            out.append(ChatMessageIn(role=m.role, content=m.content or ""))
    return out


def image_parts(images: list[str], where: str, text: str | None) -> list[ContentPart]:
    """Ollama's base64 images as chat's `image_url` parts (data URLs, the format read from the bytes),
    then the text; each part remembers its Ollama field path."""
    parts = []
    for j, data in enumerate(images):
        part = ContentPart(type="image_url", image_url=ImageURL(url=f"data:;base64,{data}"))
        part._param = f"{where}[{j}]"
        parts.append(part)
    if text:
        parts.append(ContentPart(type="text", text=text))
    return parts


class GenerateRequest(_Generating):
    """`POST /api/generate`: one prompt, through the chat template (after `system`) unless `raw`;
    `suffix` fills in the middle (a model with fill-in-the-middle tokens). No prompt only loads."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None

    def refused(self) -> str | None:
        """The field this server cannot honour, if one was sent."""
        if self.template:
            return "template"  # the model's own chat template is the only one
        if self.context:
            return "context"  # no `context` is ever returned; keep a conversation with /api/chat
        return None

    def loads_only(self) -> bool:
        return not self.prompt and not self.suffix and not self.images

    def completes(self) -> bool:
        """A raw prompt or a fill-in-the-middle: `/v1/completions`' path; else chat's."""
        return self.raw or self.suffix is not None

    def to_openai(self, model_id: str) -> ChatCompletionRequest | CompletionRequest:
        fields = self._common(model_id)
        if self.logprobs:
            fields["logprobs"] = True
            fields["top_logprobs"] = self.top_logprobs
        if self.completes():
            if fields.pop("logprobs", None):
                fields["logprobs"] = fields.pop("top_logprobs", None) or 0
            # No template: `system` has no place in the prompt (Ollama's raw mode ignores it too).
            fields.update(prompt=self.prompt or "", suffix=self.suffix)
            fields.setdefault("max_tokens", None)  # Ollama's default: until done, not OpenAI's 16
            completion: CompletionRequest = openai_body(CompletionRequest, fields)
            return completion
        fields.update(self._thinking())
        turns = [ChatMessageIn(role="system", content=self.system)] if self.system else []
        prompt: str | list[ContentPart] = self.prompt or ""
        if self.images:
            prompt = image_parts(self.images, "images", self.prompt)
        fields["messages"] = [*turns, ChatMessageIn(role="user", content=prompt)]
        chat: ChatCompletionRequest = openai_body(ChatCompletionRequest, fields)
        return chat


class EmbedRequest(RequestModel):
    """`POST /api/embed`: one text or a batch; `dimensions` shortens (and renormalises)."""

    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: Options | None = None
    keep_alive: KeepAlive | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        if isinstance(value, list) and any(not v for v in value):
            raise ValueError("input must not contain empty strings")
        if not value:
            raise ValueError("input must not be an empty string")
        return value

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class EmbeddingsRequest(RequestModel):
    """`POST /api/embeddings`, the older form: one `prompt`, one `embedding` back."""

    model: str = Field(min_length=1)
    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive | None = None


class ModelRequest(RequestModel):
    """`POST /api/show` and `DELETE /api/delete`: a model by name (older clients send `name`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None

    @property
    def model_name(self) -> str:
        name = self.model or self.name
        if not name:
            raise OllamaError("model is required", param="model")
        return name


class PullRequest(ModelRequest):
    """`POST /api/pull`: `hf.co/ORG/REPO:QUANT` deployed from the Hub (server/serving/ollama_pull.py)."""

    insecure: bool | None = None
    stream: bool | None = None


class ProgressResponse(ResponseModel):
    """One line of `/api/pull`'s progress (the last says `success`)."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


# -- responses ------------------------------------------------------------------------------------


class Timings(NestedOmitsNone):
    """The counts and durations (nanoseconds) that end every answer: real ones, measured here."""

    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    omit_when_none: ClassVar[frozenset[str]] = frozenset(
        {
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        }
    )


class CallFunction(ResponseModel):
    """A returned call's function; `arguments` an object."""

    name: str
    arguments: dict[str, Any]


class CallOut(ResponseModel):
    """A tool call in Ollama's shape: `arguments` an object, not JSON text."""

    id: str
    function: CallFunction


class MessageOut(NestedOmitsNone):
    """The assistant's message (a piece of it per streamed line); `thinking` only from a reasoning
    model that thought, `tool_calls` only when made."""

    role: Literal["assistant"] = "assistant"
    content: str
    thinking: str | None = None
    tool_calls: list[CallOut] | None = None
    omit_when_none: ClassVar[frozenset[str]] = frozenset({"thinking", "tool_calls"})


class TokenLogprobOut(ResponseModel):
    """A token's log-probability, with its bytes (a token may hold part of a character)."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class LogprobOut(TokenLogprobOut):
    """A sampled token's log-probability and the likeliest alternatives."""

    top_logprobs: list[TokenLogprobOut] | None = None

    @classmethod
    def of(cls, entry: TokenLogprob) -> LogprobOut:
        return cls(
            token=entry.token,
            logprob=entry.logprob if entry.logprob is not None else MIN_LOGPROB,
            bytes=list(entry.token_bytes),
            top_logprobs=[
                TokenLogprobOut(token=t.token, logprob=t.logprob, bytes=list(t.token_bytes))
                for t in entry.top
            ],
        )


class _ChatHead(NestedOmitsNone):
    model: str
    created_at: str
    message: MessageOut
    done: bool
    done_reason: str | None = None


class ChatChunk(Timings, _ChatHead):
    """One NDJSON line of `/api/chat` (and the whole non-streamed body): `done` on the last,
    which carries `done_reason` and the timings (after the head, in Ollama's order)."""

    logprobs: list[LogprobOut] | None = None
    omit_when_none: ClassVar[frozenset[str]] = Timings.omit_when_none | {"done_reason", "logprobs"}


class _GenerateHead(NestedOmitsNone):
    model: str
    created_at: str
    response: str
    thinking: str | None = None
    done: bool
    done_reason: str | None = None


class GenerateChunk(Timings, _GenerateHead):
    """One NDJSON line of `/api/generate` (and the whole non-streamed body); `thinking` only from
    a reasoning model that thought."""

    logprobs: list[LogprobOut] | None = None
    omit_when_none: ClassVar[frozenset[str]] = Timings.omit_when_none | {
        "done_reason",
        "logprobs",
        "thinking",
    }


class _EmbedHead(NestedOmitsNone):
    model: str
    embeddings: list[list[float]]


class EmbedResponse(Timings, _EmbedHead):
    """`/api/embed`: one unit vector per input, in input order."""


class EmbeddingsResponse(ResponseModel):
    """`/api/embeddings`: the one prompt's vector."""

    embedding: list[float]


class ModelDetails(ResponseModel):
    """`details` of a model: what the gateway knows of its files (empty where it does not)."""

    parent_model: str = ""
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class ListedModel(ResponseModel):
    """An entry of `/api/tags`."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class TagsResponse(ResponseModel):
    """`/api/tags`: the models this key may use."""

    models: list[ListedModel]


class RunningModel(ResponseModel):
    """An entry of `/api/ps`: a model with a ready replica."""

    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails
    expires_at: str
    size_vram: int
    context_length: int | None = None


class PsResponse(ResponseModel):
    """`/api/ps`: the models with a ready replica."""

    models: list[RunningModel]


class ShowResponse(ResponseModel):
    """`/api/show`: a model's parameters (its sampling defaults), info and capabilities."""

    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class VersionResponse(ResponseModel):
    """`/api/version`: the Ollama API release this follows."""

    version: str


class StatusResponse(ResponseModel):
    """A management verb's status."""

    status: str
