"""The controller's LoRA adapter operations (docs/lora.md): load an adapter into every ready replica
of its base model, or take one off, while the replicas keep serving.

Its own room because it is the one admin operation that calls into running replicas rather than
starting or draining them: an all-or-none load across replicas, then a spec change that needs no
restart (`Deployment.set_adapters`). The controller's remote methods call these functions with its
deployments and log what they did.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raygate.backends.cluster.control.deploy_checks import all_ids, pinned
from raygate.backends.cluster.control.deployment import Deployment
from raygate.backends.cluster.runtime.errors import remote_cause
from raygate.backends.engines.model_files import ModelFileError, resolve_adapter
from raygate.protocol.errors import BadRequestError, ModelNotFoundError, OpenAIError
from raygate.protocol.lora import AdapterConfig


async def load_adapter(
    deployments: Mapping[str, Deployment], base: str | None, adapter: AdapterConfig
) -> Deployment:
    """Load `adapter` into every ready replica of `base`, then add it to the spec (persisted;
    what new replicas load). A replica that refuses it undoes the others: all or none."""
    deployment = _adapter_base(deployments, base)
    name = adapter.name
    for other in deployments.values():
        if name in all_ids(other.spec):
            raise BadRequestError(
                f"`{name}` is already a model or adapter of deployment `{other.spec.name}`.",
                param="lora_name",
                code="model_exists",
            )
    if deployment.spec.backend == "vllm" and adapter.scale != 1.0:
        raise BadRequestError(
            f"LoRA adapter `{name}`: vLLM applies adapters at `scale` 1.0 only.", param="scale"
        )
    path = adapter.source.path
    if path is not None and not (Path(path).is_absolute() or path.startswith("~")):
        raise BadRequestError(
            f"`lora_path` must be absolute or a Hub id `hf:ORG/REPO` (got `{path}`).", param="lora_path"
        )
    try:
        adapter = await pinned(adapter, deployment.spec)
    except BadRequestError as exc:
        raise BadRequestError(exc.message, param="lora_path") from None
    actors = deployment.ready_actors()
    if not actors and adapter.source.hub is None:  # none to ask: at least the file must be here
        try:
            await asyncio.to_thread(resolve_adapter, adapter.source, deployment.spec.backend)
        except ModelFileError as exc:
            raise BadRequestError(f"LoRA adapter `{name}`: {exc}", param="lora_path") from None
    loaded: list[Any] = []
    try:
        for actor in actors:
            await actor.load_adapter.remote(name, adapter.source)
            loaded.append(actor)
    except Exception as exc:
        for actor in loaded:
            with contextlib.suppress(Exception):
                await actor.unload_adapter.remote(name)
        cause = remote_cause(exc)
        if isinstance(cause, OpenAIError):
            raise cause from None
        raise BadRequestError(f"Cannot load LoRA adapter `{name}`: {exc}", param="lora_path") from None
    deployment.set_adapters([*deployment.spec.adapters, adapter])
    return deployment


async def unload_adapter(deployments: Mapping[str, Deployment], name: str) -> Deployment:
    """Take `name` off its model: refused to new requests at once, its running requests finish."""
    for deployment in deployments.values():
        kept = [a for a in deployment.spec.adapters if a.name != name]
        if len(kept) == len(deployment.spec.adapters):
            continue
        deployment.set_adapters(kept)  # gateways stop sending requests for it first
        for actor in deployment.ready_actors():
            with contextlib.suppress(Exception):  # a replica that has not got it has nothing to do
                await actor.unload_adapter.remote(name)
        return deployment
    raise ModelNotFoundError(f"There is no LoRA adapter named `{name}`.", param="lora_name")


def _adapter_base(deployments: Mapping[str, Deployment], base: str | None) -> Deployment:
    """The deployment an adapter goes on: the one named (name or alias), or the only one that
    can take adapters (vLLM's server has one model, and its body names none)."""
    able = [d for d in deployments.values() if d.spec.takes_adapters]
    if base is None:
        if len(able) != 1:
            raise BadRequestError(
                "Name the model the adapter goes on in `base_model_name`: "
                f"{len(able)} deployments can take LoRA adapters.",
                param="base_model_name",
            )
        return able[0]
    for deployment in deployments.values():
        if base in deployment.spec.ids:
            if deployment not in able:
                raise BadRequestError(
                    f"Model `{base}` cannot take LoRA adapters (llama.cpp generation models "
                    "can, and vLLM ones started with `enable_lora`).",
                    param="base_model_name",
                )
            return deployment
    raise ModelNotFoundError(f"There is no deployment named `{base}`.", param="base_model_name")
