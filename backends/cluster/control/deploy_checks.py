"""What the controller checks before a spec starts anything: its model ids are free, its weights
exist (a Hub source pinned to a commit, with its vision projector and LoRA adapters), its engine
options and resources are valid and some node could host one replica.

Its own room because none of it touches a replica or the route table: plain functions over a spec
and the specs already deployed, which deploy, update and the adapter operations (adapters.py) share.
A refused spec is a 400 naming the field at fault, and nothing has changed yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from raygate.backends.cluster.runtime.placement import check_feasible, invalid_options
from raygate.backends.engines.hub_plan import hf_offline
from raygate.backends.engines.model_files import ModelFileError, resolve_model_file
from raygate.backends.engines.model_hub import pin, pin_projector
from raygate.backends.engines.options import check_engine_options
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.lora import AdapterConfig


def all_ids(spec: ModelConfig) -> set[str]:
    """Every `model` that reaches `spec`: its name, aliases and adapters."""
    return {*spec.ids, *(a.name for a in spec.adapters)}


def check_ids(spec: ModelConfig, deployed: Mapping[str, ModelConfig], replacing: str | None = None) -> None:
    """`spec`'s name and ids are its own: no other deployment in `deployed` (name -> spec) serves
    one of them; `replacing` names the deployment `spec` updates, whose ids it may keep."""
    if replacing is None and spec.name in deployed:
        raise BadRequestError(
            f"A deployment named `{spec.name}` already exists; scale or update it, or undeploy it first.",
            param="name",
            code="model_exists",
        )
    if len(set(spec.ids)) != len(spec.ids):
        raise BadRequestError("A model id is listed twice in name + aliases.", param="aliases")
    for other in deployed.values():
        if other.name in (spec.name, replacing):
            continue
        taken = sorted(all_ids(spec) & all_ids(other))
        if taken:
            raise BadRequestError(
                f"Model id `{taken[0]}` is already served by deployment `{other.name}`.",
                param="name" if taken[0] == spec.name else "aliases",
                code="model_exists",
            )


async def validate(spec: ModelConfig) -> ModelConfig:
    """What can be known before starting anything: the weights exist (on this node, or on their
    Hub: then the spec comes back with its revision pinned to a commit) and some node of the
    cluster is big enough for one replica."""
    if spec.source is not None and spec.source.hub is not None:
        try:
            source = await asyncio.to_thread(pin, spec.source, folder=spec.backend == "vllm")
        except ModelFileError as exc:
            raise BadRequestError(str(exc), param="source") from None
        spec = spec.model_copy(update={"source": source})
        spec = await _pin_projector(spec)
    elif spec.source is not None:
        if spec.source.path is not None and not Path(spec.source.path).is_absolute():
            raise BadRequestError(
                f"`source.path` must be absolute (got `{spec.source.path}`).", param="source"
            )
        try:
            await asyncio.to_thread(resolve_model_file, spec.source, folder=spec.backend == "vllm")
        except ModelFileError as exc:
            raise BadRequestError(str(exc), param="source") from None
    spec = spec.model_copy(update={"adapters": [await pinned(a, spec) for a in spec.adapters]})
    try:
        check_engine_options(spec)
    except ValueError as exc:
        raise BadRequestError(f"{exc}.", param="engine") from None
    bad = invalid_options(spec)
    if bad is not None:
        raise BadRequestError(f"Invalid resources: {bad}.", param="resources")
    why = await check_feasible(spec)
    if why is not None:
        raise BadRequestError(f"Impossible resources: {why}.", param="resources")
    return spec


async def pinned(adapter: AdapterConfig, spec: ModelConfig) -> AdapterConfig:
    """A LoRA adapter from a Hub, its revision pinned to a commit like a model's (a 400 naming
    the adapter when its repository holds nothing it could load); others as they are."""
    if adapter.source.hub is None:
        return adapter
    try:
        source = await asyncio.to_thread(pin, adapter.source, folder=spec.backend == "vllm")
    except ModelFileError as exc:
        raise BadRequestError(f"LoRA adapter `{adapter.name}`: {exc}", param="adapters") from None
    return adapter.model_copy(update={"source": source})


async def _pin_projector(spec: ModelConfig) -> ModelConfig:
    """A llama.cpp vision model from a Hub GGUF repository without a `vision.projector` takes
    the repository's `mmproj` GGUF, pinned like the model (a 400 when it has none or several);
    a projector given from a Hub is pinned too. vLLM reads its vision tower from the folder."""
    vision, source = spec.vision, spec.source
    if vision is None or source is None or spec.backend != "llama_cpp":
        return spec
    try:
        if vision.projector is None and source.hub is not None and not hf_offline():
            projector = await asyncio.to_thread(pin_projector, source)
        elif vision.projector is not None and vision.projector.hub is not None:
            projector = await asyncio.to_thread(pin, vision.projector, folder=False)
        else:
            return spec
    except ModelFileError as exc:
        raise BadRequestError(str(exc), param="vision.projector") from None
    return spec.model_copy(update={"vision": vision.model_copy(update={"projector": projector})})
