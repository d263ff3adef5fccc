"""Ollama's response bodies: the NDJSON lines of `/api/chat` and `/api/generate` (each also the
whole non-streamed body), the embeddings, the model listings of `/api/tags`, `/api/ps` and
`/api/show`, the management verbs' statuses, and the error body.

Apart from the requests (protocol/ollama.py) because nothing here is translated: the serving layer
(server/serving/ollama.py, ollama_models.py, ollama_pull.py) fills these from the engine's deltas
and the cluster's records.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from raygate.protocol.base import NestedOmitsNone, ResponseModel
from raygate.protocol.generation import TokenLogprob
from raygate.protocol.tools import MIN_LOGPROB


class OllamaErrorResponse(ResponseModel):
    """Ollama's error body on every `/api/` route: the message, and nothing else."""

    error: str


class ProgressResponse(ResponseModel):
    """One line of `/api/pull`'s progress (the last says `success`)."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


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
