"""Ollama's names for Raygate's models, and its descriptions of them (`/api/tags`, `/api/show`,
`/api/ps`), read from the gateway's route table.

A model answers to its ids as `/v1/models` lists them; Ollama's clients add a tag, and
`name:latest` is `name` (what `ollama run name` means too). Other tags name other models, as in
Ollama: an unknown one is Ollama's 404, `model 'x' not found`.

What Ollama reads from a model's files (size, quantization, architecture) lives on the replicas'
nodes, not in the gateway: a deployment launched from an Xinference registration (`origin`) says
some of it, anything else is left empty rather than guessed. The context length is the engines'
own (what the ready replicas report).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta

from fastapi import Request

from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.backends.cluster.routing.router import ModelRouter
from raygate.protocol.errors import ModelNotFoundError
from raygate.protocol.model_names import MAX_MODEL_ID_CHARS
from raygate.protocol.model_source import hub_reference
from raygate.protocol.ollama_response import ListedModel, ModelDetails, RunningModel, ShowResponse

LATEST = ":latest"
# Ollama's expiry of a model kept loaded for good (`keep_alive: -1`): far in the future.
FOREVER = datetime(2318, 1, 1, tzinfo=UTC)
# `defaults:` fields under Ollama's parameter names.
_PARAMETER_NAMES = {"repetition_penalty": "repeat_penalty", "max_tokens": "num_predict"}
_FORMATS = {"llama_cpp": "gguf", "vllm": "safetensors", "synthetic": "synthetic"}
_CAPABILITIES = {"generate": ["completion", "tools"], "embed": ["embedding"], "rerank": []}


HUB_PREFIXES = ("hf.co/", "huggingface.co/")


def hub_repo(name: str) -> tuple[str, str | None] | None:
    """`hf.co/ORG/REPO[:QUANT]` as the repository and its GGUF glob; None for any other name."""
    for prefix in HUB_PREFIXES:
        if name.lower().startswith(prefix):
            return hub_reference(name[len(prefix) :])
    return None


def pulled_name(name: str) -> str | None:
    """The deployment an `hf.co/…` reference is pulled into: the repository and quantisation,
    lower-case, in the characters a model name may hold (`llama-3.2-1b-instruct-gguf-q4_k_m`)."""
    if hub_repo(name) is None:
        return None
    ref = name.split("/", 1)[1]
    repo, _, quant = ref.partition(":")
    stem = repo.rsplit("/", 1)[-1] + (f"-{quant}" if quant and quant != "latest" else "")
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:MAX_MODEL_ID_CHARS] or None


def not_found(name: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"model '{name}' not found", param="model")


def cluster_of(request: Request) -> ControllerClient:
    cluster: ControllerClient = request.app.state.cluster
    return cluster


def model_id(request: Request, name: str) -> str:
    """The id `name` reaches (`name:latest` reaches `name`); Ollama's 404 when none.
    A model that is loading or has no replica answers as on `/v1` (503)."""
    cluster = cluster_of(request)
    candidates = [name, name.removesuffix(LATEST)] if name.endswith(LATEST) else [name]
    pulled = pulled_name(name)
    if pulled is not None:  # `hf.co/ORG/REPO:QUANT`: the deployment `/api/pull` made of it
        candidates.append(pulled)
    for candidate in candidates:
        try:
            cluster.get(candidate)
        except ModelNotFoundError:
            continue
        return candidate
    raise not_found(name)


def timestamp(when: datetime | float) -> str:
    """RFC 3339 with nanosecond-free precision, as Go's time marshals it."""
    moment = when if isinstance(when, datetime) else datetime.fromtimestamp(when, UTC)
    return moment.isoformat().replace("+00:00", "Z")


def context_length(router: ModelRouter) -> int | None:
    lengths = [r.context_length for r in router.replicas if r.context_length > 0]
    if lengths:
        return max(lengths)
    declared = router.config.engine.get("n_ctx") or router.config.engine.get("max_model_len")
    return declared if isinstance(declared, int) else None


def digest(router: ModelRouter) -> str:
    """A stable id of the deployment's spec (Ollama's is its manifest's): changes when it does."""
    spec = json.dumps(router.config.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()


def details(router: ModelRouter) -> ModelDetails:
    config = router.config
    origin = config.origin
    family = origin.model_name if origin else config.name
    size = origin.model_size_in_billions if origin else None
    return ModelDetails(
        format=_FORMATS.get(config.backend, config.backend),
        family=family,
        families=[family],
        parameter_size=f"{size}B" if size else "",
        quantization_level=origin.quantization if origin else "",
    )


def capabilities(router: ModelRouter) -> list[str]:
    """Ollama's capability names; `thinking` for a reasoning model (its `reasoning:` block),
    `vision` for one that reads images (its `vision:` block)."""
    config = router.config
    found = list(_CAPABILITIES.get(config.task, []))
    if config.task == "generate" and config.reasoning is not None:
        found.append("thinking")
    if config.task == "generate" and config.vision is not None:
        found.append("vision")
    return found


def listed(cluster: ControllerClient, name: str) -> ListedModel:
    router = cluster.get(name)
    return ListedModel(
        name=name,
        model=name,
        modified_at=timestamp(cluster.created),
        size=0,  # the weights are on the replicas' nodes
        digest=digest(router),
        details=details(router),
    )


def running(cluster: ControllerClient, name: str, now: datetime) -> RunningModel:
    """A model with a ready replica; it expires when autoscaling would take its last replica."""
    router = cluster.get(name)
    scaling = router.config.autoscaling
    expires = (
        now + timedelta(seconds=scaling.to_zero_delay_s) if scaling and scaling.min_replicas == 0 else FOREVER
    )
    return RunningModel(
        name=name,
        model=name,
        size=0,
        digest=digest(router),
        details=details(router),
        expires_at=timestamp(expires),
        size_vram=0,
        context_length=context_length(router),
    )


def parameters(router: ModelRouter) -> str:
    """The model's sampling defaults as Modelfile `PARAMETER` lines (Ollama's names)."""
    lines = [
        f"{_PARAMETER_NAMES.get(k, k)} {v}"
        for k, v in router.sampling_defaults().model_dump(exclude_none=True).items()
    ]
    return "\n".join(lines)


def show(cluster: ControllerClient, name: str) -> ShowResponse:
    router = cluster.get(name)
    config = router.config
    context = context_length(router)
    params = parameters(router)
    info: dict[str, object] = {
        "general.architecture": config.backend,
        "general.basename": config.name,
        "raygate.task": config.task,
    }
    if context is not None:
        info[f"{config.backend}.context_length"] = context
    modelfile = f"# Served by Raygate ({config.backend})\nFROM {config.name}\n" + "".join(
        f"PARAMETER {line}\n" for line in params.splitlines()
    )
    return ShowResponse(
        modelfile=modelfile,
        parameters=params,
        # The engine applies the model's own chat template (its GGUF's or tokenizer's Jinja).
        template="",
        details=details(router),
        model_info=info,
        capabilities=capabilities(router),
        modified_at=timestamp(cluster.created),
    )
