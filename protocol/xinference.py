"""Xinference's REST API (seed 003): model registrations, launch by name, describe, prompt styles.

A second face of the same registry: a launched model is an ordinary deployment (`ModelConfig`)
that remembers where it came from (`LaunchOrigin`), so `/admin`, the CLI, metrics, API keys and
scaling see it, and `GET /v1/models/{uid}` can describe it in Xinference's shape.

Registrations are admin input, so they are strict like `models.yaml` entries: an unknown field is
an error that names it, never silently dropped. Xinference's own spelling is kept field by field
(`model_specs`, `quantizations`, `model_uri`, `model_file_name_template`, ...).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from raygate.protocol.base import RequestModel, ResponseModel, StrictModel
from raygate.protocol.config import Task
from raygate.protocol.errors import ErrorResponse
from raygate.protocol.model_names import NAME_PATTERN
from raygate.protocol.models import ModelCard

# Xinference's model types that map onto a Raygate task: `rerank` joins as soon as the deployment
# spec has `task: rerank` (protocol/config.py `Task`).
MODEL_TYPE_TASK: dict[str, str] = {
    "LLM": "generate",
    "embedding": "embed",
    **({"rerank": "rerank"} if "rerank" in get_args(Task) else {}),
}
# What a model of each task can do, in Xinference's words (for a deployment made without a family).
Ability = Literal["generate", "chat", "embed", "rerank"]
TASK_ABILITY: dict[str, list[Ability]] = {
    "generate": ["generate", "chat"],
    "embed": ["embed"],
    "rerank": ["rerank"],
}
TASK_MODEL_TYPE: dict[str, str] = {task: model_type for model_type, task in MODEL_TYPE_TASK.items()}

# What Raygate can run, as Xinference names engines and formats: a GGUF on llama.cpp, a Hugging
# Face folder on vLLM. Keys are spelled as Xinference spells them (what `GET /v1/models/{uid}`
# answers in `model_engine`); a launch's engine is matched case-insensitively (`ENGINE_NAMES`).
ENGINE_FORMATS: dict[str, tuple[str, str]] = {
    "llama.cpp": ("ggufv2", "llama_cpp"),
    "vLLM": ("pytorch", "vllm"),
}
ENGINE_NAMES: dict[str, str] = {engine.lower(): engine for engine in ENGINE_FORMATS}
ENGINE_OF_BACKEND: dict[str, str] = {backend: engine for engine, (_, backend) in ENGINE_FORMATS.items()}
FORMAT_ENGINE: dict[str, str] = {fmt: engine for engine, (fmt, _) in ENGINE_FORMATS.items()}
SUPPORTED = "llama.cpp for `ggufv2` (a GGUF file), vLLM for `pytorch` (a Hugging Face folder)"

_NAME = re.compile(NAME_PATTERN)


class PromptStyle(StrictModel):
    """How to turn a chat into a prompt for a model that carries no chat template (Xinference's
    `PromptStyleV1`); Raygate renders it as a Jinja chat template (`chat_template`)."""

    style_name: str = Field(max_length=64)
    system_prompt: str = Field("", max_length=20_000)
    roles: list[str] = Field(min_length=2, max_length=2, description="[user role, assistant role]")
    intra_message_sep: str = Field("", max_length=200)
    inter_message_sep: str = Field("", max_length=200)
    stop: list[str] | None = Field(None, max_length=16)
    stop_token_ids: list[int] | None = Field(None, max_length=64)

    @field_validator("style_name")
    @classmethod
    def _known_style(cls, value: str) -> str:
        if value not in STYLE_TEMPLATES:
            raise ValueError(
                f"prompt style `{value[:40]}` is not one Raygate renders: {', '.join(STYLE_TEMPLATES)}"
            )
        return value


class ModelSpec(StrictModel):
    """One entry of `model_specs`: a format and size, and where its files are (`model_uri`, a folder or
    `file://` URI; for a GGUF, `model_file_name_template` with `{quantization}` names the file)."""

    model_format: str = Field(max_length=32)
    model_size_in_billions: str | int | None = None
    quantizations: list[str] = Field(default_factory=lambda: [""], max_length=64)
    model_id: str | None = Field(None, max_length=300)
    model_file_name_template: str | None = Field(None, max_length=300)
    model_hub: str = Field("huggingface", max_length=32)
    model_uri: str | None = Field(None, max_length=1000)
    model_revision: str | None = Field(None, max_length=100)

    @field_validator("quantizations")
    @classmethod
    def _some_quantization(cls, value: list[str]) -> list[str]:
        return value or [""]


class ModelFamily(StrictModel):
    """A registration (Xinference's `LLMFamilyV1`, and the embedding family's fields): what
    `POST /v1/model_registrations/{model_type}` carries as a JSON string in `model`."""

    version: Literal[1] = 1
    model_name: str
    context_length: int | None = Field(None, ge=1, le=10_000_000)
    model_lang: list[str] = Field(default_factory=lambda: ["en"], max_length=64)
    model_ability: list[Ability] = Field(default_factory=list, max_length=8)
    model_description: str | None = Field(None, max_length=2000)
    model_family: str | None = Field(None, max_length=128)
    model_specs: list[ModelSpec] = Field(min_length=1, max_length=32)
    prompt_style: PromptStyle | None = None
    # Embedding families (Xinference's `CustomEmbeddingModelSpec`).
    dimensions: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    language: list[str] | None = None

    @field_validator("model_name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"model_name {value[:40]!r} must be 1-128 characters: letters, digits, `.`, `_`, `-`, "
                "starting with a letter or digit (it is a URL path segment and a deployment name)"
            )
        return value


class RegisterRequest(StrictModel):
    """Body of `POST /v1/model_registrations/{model_type}`."""

    model: str = Field(max_length=200_000, description="The family (`ModelFamily`) as a JSON string.")
    persist: bool = Field(False, description="Keep it in the state directory across restarts.")
    worker_ip: str | None = Field(
        None, description="Accepted for the client's sake; every node shares one registry."
    )

    def family(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.model)
        except json.JSONDecodeError as exc:
            raise ValueError(f"`model` is not a JSON string of a model family: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("`model` must be a JSON object (a model family)")
        return raw


class LaunchRequest(RequestModel):
    """Body of `POST /v1/models`. Xinference's client sends every field, most of them null; what
    Raygate cannot honour is refused by name when set. Any other field is an engine option
    (`n_ctx`, `n_threads`, `n_gpu_layers`, ...), passed to the engine as a `models.yaml` `engine:`."""

    model_name: str = Field(max_length=128)
    model_uid: str | None = Field(None, max_length=128)
    model_type: str = "LLM"
    model_engine: str | None = Field(None, max_length=32)
    model_format: str | None = Field(None, max_length=32)
    model_size_in_billions: str | int | float | None = None
    quantization: str | None = Field(None, max_length=64)
    replica: int = Field(1, ge=1, le=64)
    n_gpu: int | str | None = "auto"
    request_limits: int | None = Field(None, ge=1)
    envs: dict[str, str] | None = None
    # Sent by the client; refused when set (Raygate places replicas itself, has no LoRA here).
    n_worker: int | None = None
    peft_model_config: dict[str, Any] | None = None
    worker_ip: str | None = None
    gpu_idx: int | list[int] | None = None
    replica_config: list[dict[str, Any]] | None = None
    model_path: str | None = None
    enable_thinking: bool | None = None
    enable_virtual_env: bool | None = None
    virtual_env_packages: list[str] | None = None
    virtual_env_find_links: list[str] | None = None

    def refused(self) -> str | None:
        """The first field set that Raygate cannot honour, as a message for `detail`."""
        if self.n_worker not in (None, 1):
            return "`n_worker` > 1 is not supported: a Raygate replica runs on one node."
        for field in (
            "peft_model_config",
            "worker_ip",
            "gpu_idx",
            "replica_config",
            "model_path",
            "enable_thinking",
            "enable_virtual_env",
            "virtual_env_packages",
            "virtual_env_find_links",
        ):
            if getattr(self, field) not in (None, [], {}):
                return f"`{field}` is not supported by Raygate's Xinference API; leave it unset."
        return None

    def engine_options(self) -> dict[str, Any]:
        return {k: v for k, v in (self.model_extra or {}).items() if v is not None}


class LaunchResult(ResponseModel):
    """Answer to `POST /v1/models`: the uid the model is served under (its deployment name)."""

    model_uid: str


class XinferenceModelCard(ModelCard):
    """`GET /v1/models/{uid}`: OpenAI's model object (`id`, `object`, `created`, `owned_by`) and
    Xinference's description (`model_type`, `model_ability`, ...) in one body, so both clients
    read the same path."""

    model_type: str
    model_name: str
    model_ability: list[str]
    model_lang: list[str]
    model_description: str | None
    model_format: str | None
    model_engine: str | None
    model_size_in_billions: str | int | None
    quantization: str | None
    context_length: int | None
    replica: int
    ready_replicas: int
    state: str


# ---- prompt styles ---------------------------------------------------------------------------

# Each style as Xinference's ChatModelMixin.get_prompt renders it, written as a Jinja chat template
# over the style's values (`S` below). A system message replaces `system_prompt`; the generation
# prompt is the assistant role with nothing after it.
_COMMON = (
    "{%- set ns = namespace(system=S.system_prompt) -%}"
    "{%- for m in messages if m.role == 'system' -%}{%- set ns.system = m.content -%}{%- endfor -%}"
    "{%- set turns = messages | rejectattr('role', 'equalto', 'system') | list -%}"
)
STYLE_TEMPLATES: dict[str, str] = {
    "ADD_COLON_SINGLE": _COMMON
    + "{{ ns.system }}{{ S.intra }}"
    + "{%- for m in turns -%}{{ S.roles[0] if m.role == 'user' else S.roles[1] }}: {{ m.content }}"
    + "{{ S.intra }}"
    + "{%- endfor -%}{%- if add_generation_prompt -%}{{ S.roles[1] }}:{%- endif -%}",
    "ADD_COLON_TWO": _COMMON
    + "{{ ns.system }}{{ S.intra }}"
    + "{%- for m in turns -%}{{ S.roles[0] if m.role == 'user' else S.roles[1] }}: {{ m.content }}"
    + "{{ S.intra if loop.index0 % 2 == 0 else S.inter }}"
    + "{%- endfor -%}{%- if add_generation_prompt -%}{{ S.roles[1] }}:{%- endif -%}",
    "NO_COLON_TWO": _COMMON
    + "{{ ns.system }}"
    + "{%- for m in turns -%}{{ S.roles[0] if m.role == 'user' else S.roles[1] }}{{ m.content }}"
    + "{{ S.intra if loop.index0 % 2 == 0 else S.inter }}"
    + "{%- endfor -%}{%- if add_generation_prompt -%}{{ S.roles[1] }}{%- endif -%}",
    "CHATML": _COMMON
    + "{%- if ns.system -%}<|im_start|>system\n{{ ns.system }}{{ S.intra }}{{ S.inter }}{%- endif -%}"
    + "{%- for m in turns -%}{{ S.roles[0] if m.role == 'user' else S.roles[1] }}\n{{ m.content }}"
    + "{{ S.intra }}{{ S.inter }}"
    + "{%- endfor -%}{%- if add_generation_prompt -%}{{ S.roles[1] ~ '\\n' }}{%- endif -%}",
}

# The styles Raygate renders, with example values (`GET /v1/models/prompts` lists them).
BUILTIN_PROMPT_STYLES: dict[str, dict[str, Any]] = {
    "ADD_COLON_SINGLE": {"roles": ["USER", "ASSISTANT"], "intra_message_sep": "\n"},
    "ADD_COLON_TWO": {"roles": ["USER", "ASSISTANT"], "intra_message_sep": " ", "inter_message_sep": "</s>"},
    "NO_COLON_TWO": {"roles": [" <reserved_102> ", " <reserved_103> "], "inter_message_sep": "</s>"},
    "CHATML": {
        "roles": ["<|im_start|>user", "<|im_start|>assistant"],
        "intra_message_sep": "<|im_end|>",
        "inter_message_sep": "\n",
        "stop": ["<|im_end|>"],
    },
}


def _literal(value: Any) -> str:
    """A Jinja literal for a string or list of strings: JSON with ASCII escapes reads back exactly
    (Jinja decodes `\\n`, `\\"`, `\\uXXXX` in string literals as Python does)."""
    return json.dumps(value, ensure_ascii=True)


def chat_template(style: PromptStyle) -> str:
    """The Jinja chat template that renders chats in `style` (the engine's `chat_template` option)."""
    values = (
        "{%- set S = namespace("
        f"system_prompt={_literal(style.system_prompt)}, roles={_literal(style.roles)}, "
        f"intra={_literal(style.intra_message_sep)}, inter={_literal(style.inter_message_sep)}"
        ") -%}"
    )
    return values + STYLE_TEMPLATES[style.style_name]


def builtin_prompt_styles() -> dict[str, PromptStyle]:
    return {name: PromptStyle(style_name=name, **values) for name, values in BUILTIN_PROMPT_STYLES.items()}


class XinferenceErrorResponse(ErrorResponse):
    """An error on the paths Xinference shares with OpenAI: its client shows `detail`, OpenAI's reads
    `error`, so the body carries both."""

    detail: str
