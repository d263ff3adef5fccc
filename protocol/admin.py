"""The `/admin` wire format: deployment status as operators (and `raygate list`) see it.

A deployment *is* a `ModelConfig` (the same schema as a `models.yaml` entry); these models add the
live state the controller keeps about it.

Replica states:
    loading   actor created, waiting for resources or loading weights
    ready     serving requests
    draining  taken out of routing; finishing its in-flight requests before it stops
    failed    could not load, or died with no restarts left (`error` says why)

Deployment states:
    downloading  fewer ready replicas than asked for, and some are fetching weights from a Hub
                 (`download` says how far; protocol/model_source.py `ModelSource.hf`)
    loading   fewer ready replicas than asked for, some still loading
    ready     as many ready replicas as asked for
    degraded  serving, but with fewer ready replicas than asked for and none loading
    failed    no replica ready and none loading (`error` says why)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raygate.protocol.base import ResponseModel, StrictModel
from raygate.protocol.config import ModelConfig
from raygate.protocol.policies import RoutingConfig

ReplicaState = Literal["loading", "ready", "draining", "failed"]
DeploymentState = Literal["downloading", "loading", "ready", "degraded", "failed"]


class DownloadProgress(ResponseModel):
    """A replica fetching its weights from a Hub onto its node (a `loading` replica's first step).
    Read from the node's cache, so a replica waiting for another's download on the same node
    shows the same bytes."""

    hub: str = Field(description="`hf` (Hugging Face Hub) or `modelscope`.")
    repo: str
    revision: str = Field(description="The commit being fetched.")
    files: list[str] = Field(description="The files fetched (a GGUF, its split shards, or a model folder's).")
    bytes_done: int = Field(description="Bytes on this node's disk so far (resumed downloads count theirs).")
    bytes_total: int
    bytes_per_s: float = Field(description="Mean rate since the replica started.")
    done: bool = Field(False, description="Every file is on the node and verified.")
    cached: bool = Field(False, description="The node already held the files: nothing was downloaded.")


class ReplicaStatus(ResponseModel):
    """One replica as `/admin` reports it; `state` follows the replica states in the module docstring."""

    id: str = Field(description="Stable within the deployment, e.g. `my-model#3`.")
    state: ReplicaState
    node_id: str | None = Field(None, description="Ray node the replica runs on, once known.")
    error: str | None = None
    since: float = Field(description="Unix time the replica entered `state`.")
    download: DownloadProgress | None = Field(
        None, description="While a loading replica fetches its weights from a Hub (and after)."
    )


class ScalingEvent(ResponseModel):
    """One change of a deployment's desired replica count, by the autoscaler or by hand."""

    at: float = Field(description="Unix time of the decision.")
    from_replicas: int
    to_replicas: int
    reason: str = Field(description="e.g. `ongoing=7.0 target=2 -> 4`, `scale from zero`, `admin scale`.")


class DeploymentStatus(ResponseModel):
    """A deployment as `/admin` and `raygate list` show it: its spec (a `ModelConfig`) plus the live state,
    ready/desired counts and replicas the controller keeps."""

    name: str
    state: DeploymentState
    error: str | None = Field(None, description="Why the deployment (or its last change) failed.")
    ready: int
    desired: int
    restarts: int = Field(description="Replicas replaced since the last deploy, scale or update.")
    updating: bool = Field(False, description="A rolling update to a new spec is in progress.")
    routing: str = Field(
        RoutingConfig().policy, description="The replica choice policy (`spec.routing.policy`)."
    )
    autoscaled: bool = Field(False, description="`desired` follows load (`spec.autoscaling`).")
    ongoing: float = Field(0.0, description="Ongoing requests all gateways reported last (autoscaled only).")
    scaling_events: list[ScalingEvent] = Field(
        default_factory=list, description="The latest changes of `desired`, oldest first."
    )
    spec: ModelConfig
    replicas: list[ReplicaStatus]
    download: DownloadProgress | None = Field(
        None,
        description="The furthest-behind unfinished download of the deployment's loading replicas "
        "(state `downloading`).",
    )


class DeploymentList(ResponseModel):
    """Body of `GET /admin/deployments`: every deployment in the registry, in OpenAI's list envelope."""

    object: Literal["list"] = "list"
    data: list[DeploymentStatus]


class ScaleRequest(StrictModel):
    """Body of `PATCH /admin/deployments/{name}`: change only the replica count. Strict, as admin input is;
    removed replicas drain first, for up to `drain_timeout` seconds."""

    replicas: int = Field(ge=1, le=64, description="Replicas to run from now on.")
    drain_timeout: float = Field(
        60.0, ge=0, le=3600, description="Seconds a removed replica may spend finishing its requests."
    )


class UndeployResult(ResponseModel):
    """Answer to `DELETE /admin/deployments/{name}`: `drained` false means requests were cut short."""

    name: str
    drained: bool = Field(description="Every in-flight request finished before the replicas stopped.")
    seconds: float = Field(description="How long draining took.")


class ModelMetricsSeries(ResponseModel):
    """One model's last minutes as the web console charts them: one point per sampling interval,
    stamped with the interval's end (`t`, Unix seconds). TTFT quantiles are null where no request
    got its first token in that interval."""

    t: list[float]
    requests_per_s: list[float]
    tokens_per_s: list[float]
    ttft_p50_s: list[float | None]
    ttft_p95_s: list[float | None]
    running: list[float]
    waiting: list[float]
    replicas_ready: list[float]


class MetricsHistory(ResponseModel):
    """Body of `GET /admin/metrics`: the gateway's own metrics registry, sampled every `interval_s`
    seconds over the last minutes, per model."""

    interval_s: float
    models: dict[str, ModelMetricsSeries]


class LoadLoraAdapterRequest(StrictModel):
    """Body of `POST /v1/load_lora_adapter` (vLLM's) and `POST /admin/adapters` (docs/lora.md)."""

    lora_name: str = Field(description="The id clients then send as `model`.")
    lora_path: str = Field(
        min_length=1,
        max_length=4096,
        description="The adapter on the replicas' nodes: an absolute path or `~/...` (a GGUF LoRA "
        "file for llama.cpp, a PEFT adapter folder for vLLM), or a Hub repository `hf:ORG/REPO`.",
    )
    base_model_name: str | None = Field(
        None,
        description="The model it goes on (name or alias); may be left out when only one model can "
        "take adapters. Raygate's field.",
    )
    scale: float = Field(1.0, ge=-100, le=100, allow_inf_nan=False, description="How strongly it applies.")
    # vLLM's, accepted and unused: an adapter is one name here.
    lora_int_id: int | None = None
    load_inplace: bool = False


class UnloadLoraAdapterRequest(StrictModel):
    """Body of `POST /v1/unload_lora_adapter` (vLLM's)."""

    lora_name: str = Field(description="The adapter to take off its model.")
    lora_int_id: int | None = None
