"""Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, ...): request models, and the
translation of a request into the OpenAI body the one serving layer already runs. A chat turn and
its translation are in protocol/ollama_messages.py, the response bodies in ollama_response.py.

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

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from raygate.protocol.base import RequestModel
from raygate.protocol.chat import ChatCompletionRequest, ChatMessageIn, ContentPart
from raygate.protocol.completions import CompletionRequest
from raygate.protocol.embeddings import EmbeddingRequest
from raygate.protocol.errors import BadRequestError
from raygate.protocol.ollama_messages import OllamaMessage, chat_messages, image_parts
from raygate.protocol.tools import MAX_TOOLS, FunctionDefinition, ToolChoice, ToolDefinition

# What `GET /api/version` reports: the Ollama release whose API this follows (clients compare it
# to decide which fields they may send).
OLLAMA_API_VERSION = "0.12.6"

# Sampling options with no engine here, and the value at which each is "off" (accepted).
_UNSUPPORTED_OPTIONS: dict[str, float] = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}


class OllamaError(BadRequestError):
    """A 400 worded as Ollama words it (the `error` string is all its clients show)."""


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
