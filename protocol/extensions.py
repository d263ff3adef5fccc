"""vLLM's sampling extensions to OpenAI's chat and completions bodies, and llama-server's names.

Clients written for vLLM (Open WebUI, LangChain's `model_kwargs`, llama-index, `vllm bench serve`)
send these in the openai SDK's `extra_body`; clients written for llama-server send its spellings.
Both are typed here, once, so a field is either honoured by the engine, refused with a 400 that
names it, or (when nobody knows it) logged as unknown; never silently dropped on the floor.

The names, ranges and "off" values are vLLM's (`vllm.SamplingParams`): `top_k` 0 or -1 is off,
`min_p` 0 is off, `repetition_penalty` 1 is off. Bounds on grammars, regexes and word lists keep
one request from making the engine compile something huge.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, field_validator, model_validator

from raygate.protocol.base import RequestModel, StrictModel
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import SamplingParams

MAX_GRAMMAR_CHARS = 32_768
MAX_REGEX_CHARS = 4_096
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1_024
MAX_STOP_TOKEN_IDS = 64
MAX_ALLOWED_TOKEN_IDS = 262_144  # a whole large vocabulary
MAX_BAD_WORDS = 256
MAX_BAD_WORD_CHARS = 256

# vLLM's older top-level spellings of `structured_outputs.<key>`.
GUIDED_SPELLINGS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
# llama-server's top-level spellings: `grammar` (GBNF) and `json_schema` constrain the output.
LLAMA_SERVER_CONSTRAINTS = {"grammar": "grammar", "json_schema": "json"}
LLAMA_SERVER_RENAMES = {"repeat_penalty": "repetition_penalty"}


class StructuredOutputs(StrictModel):
    """vLLM's `structured_outputs`: exactly one constraint. Strict, so a key vLLM has and this
    gateway does not map (`structural_tag`, `whitespace_pattern` ...) is a 400, not ignored."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = Field(None, min_length=1, max_length=MAX_REGEX_CHARS)
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = Field(None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    json_object: bool | None = None

    @field_validator("choice")
    @classmethod
    def _short_choices(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not c or len(c) > MAX_CHOICE_CHARS for c in value):
            raise ValueError(f"choices must be non-empty strings of at most {MAX_CHOICE_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("give exactly one of `json`, `regex`, `choice`, `grammar`, `json_object`")
        return self

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the output must satisfy, when this is a JSON constraint."""
        if self.json_object:
            return {"type": "object"}
        if isinstance(self.json_, str):
            try:
                schema = json.loads(self.json_)
            except ValueError:
                raise BadRequestError(
                    "`structured_outputs.json` is not valid JSON.", param="structured_outputs"
                ) from None
            if not isinstance(schema, dict):
                raise BadRequestError(
                    "`structured_outputs.json` must be a JSON schema object.", param="structured_outputs"
                )
            return schema
        return self.json_


def fold_n_probs(data: Any, *targets: tuple[str, Any]) -> Any:
    """llama-server's `n_probs` (top alternatives per token) as the endpoint's own logprobs fields:
    `targets` are (field, value) pairs, where the value `...` stands for the `n_probs` number."""
    if not isinstance(data, dict) or data.get("n_probs") is None:
        return data
    data = dict(data)
    n = data.pop("n_probs")
    for name, value in targets:
        if data.get(name) is not None:
            raise ValueError(f"`n_probs` and `{name}` both ask for logprobs; send one of them")
        data[name] = n if value is ... else value
    return data


def _fold_aliases(data: Any) -> Any:
    """Rewrite the other spellings to the canonical fields before validation; two spellings of
    one field in the same body are a 400 (which one would win is a guess)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, new in LLAMA_SERVER_RENAMES.items():
        if old in data:
            if new in data:
                raise ValueError(f"`{old}` and `{new}` are the same field; send one of them")
            data[new] = data.pop(old)
    constraints = {**GUIDED_SPELLINGS, **LLAMA_SERVER_CONSTRAINTS}
    folded = {constraints[k]: data.pop(k) for k in list(data) if k in constraints and data[k] is not None}
    for k in constraints:
        data.pop(k, None)  # an explicit null means "none"
    if folded:
        if data.get("structured_outputs") is not None or len(folded) > 1:
            raise ValueError("send one output constraint (`structured_outputs` or one `guided_*` field)")
        data["structured_outputs"] = folded
    return data


class SamplingExtensions(RequestModel):
    """The vLLM fields chat and completions share, with vLLM's bounds."""

    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    allowed_token_ids: list[int] | None = Field(None, min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS)
    bad_words: list[str] | None = Field(None, max_length=MAX_BAD_WORDS)
    structured_outputs: StructuredOutputs | None = None
    # Beam search only, in vLLM: refused when asked for (no backend here searches beams).
    length_penalty: float = Field(1.0, allow_inf_nan=False)
    use_beam_search: bool = False

    @model_validator(mode="before")
    @classmethod
    def _other_spellings(cls, data: Any) -> Any:
        return _fold_aliases(data)

    @field_validator("stop_token_ids", "allowed_token_ids")
    @classmethod
    def _token_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(t < 0 for t in value):
            raise ValueError("token ids are non-negative")
        return value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _keeps_something(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("keep at least 1 prompt token (-1: as many as the context holds)")
        return value

    @field_validator("bad_words")
    @classmethod
    def _short_words(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not w or len(w) > MAX_BAD_WORD_CHARS for w in value):
            raise ValueError(
                f"bad words must be non-empty strings of at most {MAX_BAD_WORD_CHARS} characters"
            )
        return value

    def unsupported_extensions(self) -> list[str]:
        """vLLM fields no backend here implements: beam search and its length penalty."""
        refused = ["use_beam_search"] if self.use_beam_search else []
        return refused + (["length_penalty"] if self.length_penalty != 1.0 else [])

    def apply_extensions(self, params: SamplingParams) -> SamplingParams:
        """Copy the extensions onto `params` (built from the OpenAI fields); checks that need
        both, like `min_tokens` against `max_tokens`, are here."""
        if params.max_tokens is not None and self.min_tokens > params.max_tokens:
            raise BadRequestError(
                f"`min_tokens` ({self.min_tokens}) is more than `max_tokens` ({params.max_tokens}).",
                param="min_tokens",
            )
        params.top_k = self.top_k
        params.min_p = self.min_p or 0.0
        params.repetition_penalty = 1.0 if self.repetition_penalty is None else self.repetition_penalty
        params.min_tokens = self.min_tokens
        params.ignore_eos = self.ignore_eos
        params.stop_token_ids = list(self.stop_token_ids or [])
        params.include_stop_str_in_output = self.include_stop_str_in_output
        params.skip_special_tokens = self.skip_special_tokens
        params.truncate_prompt_tokens = self.truncate_prompt_tokens
        params.allowed_token_ids = self.allowed_token_ids
        params.bad_words = list(self.bad_words or [])
        constraint = self.structured_outputs
        if constraint is not None:
            if params.json_schema is not None:
                raise BadRequestError(
                    "Send one output constraint: `response_format` or `structured_outputs`.",
                    param="structured_outputs",
                )
            params.json_schema = constraint.output_schema()
            params.regex, params.choice, params.grammar = (
                constraint.regex,
                constraint.choice,
                constraint.grammar,
            )
        return params


def supported_extensions() -> list[str]:
    """The extension fields (and other spellings) a generating model honours, for its model card;
    the beam-search fields are accepted only at their "off" values, so they are not listed."""
    names = set(SamplingExtensions.model_fields) - {"length_penalty", "use_beam_search"}
    names |= set(GUIDED_SPELLINGS) | set(LLAMA_SERVER_CONSTRAINTS) | set(LLAMA_SERVER_RENAMES)
    names.add("n_probs")
    return sorted(names)
