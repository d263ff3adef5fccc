"""Model weights from a Hub: the Hugging Face Hub (`source: {hf: ...}`) or ModelScope (`{modelscope: ...}`).

Two steps, on two sides of the cluster:

- `pin` (the controller, at deploy time): list the repository at the asked revision through the
  Hub's API, pick the files (`file`: a glob choosing one GGUF, whose split shards come along; no
  `file`: the whole repository for vLLM), and replace the revision by the commit it names, so the
  registry holds a revision that never moves: a restart, or a replica on another node, loads the
  same bytes. What is wrong with the source (no such repository, revision or file, several GGUFs
  matching, a gated repository without a token) is a 400 here, before anything starts.
- `fetch` (the replica, on its own node, before the engine loads): download the picked files into
  the Hub library's own cache (`HF_HOME` / `MODELSCOPE_CACHE`), under a file lock per repository,
  so replicas and gateways sharing a node download once; a node that already holds a pinned
  commit's files (a marker written after they were verified) uses them without asking the Hub,
  which is also what `HF_HUB_OFFLINE=1` needs. Each LFS file's sha256 is checked against the Hub's;
  a mismatch deletes the file and fails the load with the reason. A download cut mid-file (the
  Hub gone for a while, or the replica killed) resumes from the bytes on disk: they are kept in a
  partial file of ours across calls, replicas and restarts, and huggingface_hub's `http_get`
  continues it with a `Range` request (`Download._fetch_hf_once`). Not enough free disk fails
  before the first byte, naming both sizes.

Progress (`Download.progress()`) is read from the cache on disk, not from the library's progress
bars, so a replica waiting on another's lock reports the same bytes as the one downloading.

This module holds the entry points the controller and the replica call; the parts live beside it:
`hub_plan` (which files a source picks, and the Hubs' errors), `hub_download` (the fetch on the
node, `Download`) and `hub_cache` (where the files, markers and partial files sit on the node).
"""

from __future__ import annotations

from typing import Any

from raygate.backends.engines.hub_download import Download
from raygate.backends.engines.hub_plan import (
    COMMIT,
    PROJECTOR_GLOB,
    HubError,
    hf_offline,
    plan_hf,
    plan_modelscope,
    transient,
)
from raygate.protocol.admin import DownloadProgress
from raygate.protocol.config import ModelConfig
from raygate.protocol.model_source import ModelSource

# ---- deploy time -------------------------------------------------------------------------------


def pin(source: ModelSource, *, folder: bool) -> ModelSource:
    """`source` with its revision replaced by the commit it names now (a network call), after
    checking that it picks files at all. Unchanged when the Hub cannot be asked (offline mode):
    the replicas then resolve it from their nodes' caches. ModelScope sources are listed (a 400
    when they pick nothing) but keep their revision."""
    if source.hub == "modelscope":
        try:
            plan_modelscope(source, folder=folder)  # what cannot be found is a 400 now
        except HubError as exc:
            if not _unreachable(exc):
                raise
        return source
    if hf_offline():
        return source
    try:
        plan = plan_hf(source, folder=folder)
    except HubError as exc:
        if source.revision is not None and COMMIT.fullmatch(source.revision) and _unreachable(exc):
            return source  # already pinned; the nodes' caches may hold it
        raise
    return source.model_copy(update={"revision": plan.commit})


def pin_projector(source: ModelSource) -> ModelSource:
    """The projector (`mmproj`) of the vision model `source` (a GGUF picked out of a Hub
    repository, already pinned): the repository's one `*mmproj*.gguf`, as a source pinned like the
    model's. None or several is a HubError naming what is there (a network call)."""
    wanted = source.model_copy(update={"file": PROJECTOR_GLOB})
    try:
        plan = plan_hf(wanted, folder=False) if source.hub == "hf" else plan_modelscope(wanted, folder=False)
    except HubError as exc:
        raise HubError(
            f"{exc}; a vision model needs its projector: give `vision.projector` (a `source`), or "
            "deploy from a repository that holds one `mmproj` GGUF"
        ) from exc
    return wanted.model_copy(update={"file": plan.names[0], "revision": plan.commit})


def _unreachable(exc: HubError) -> bool:
    cause = exc.__context__
    return cause is not None and isinstance(cause, Exception) and transient(cause)


# ---- a replica's Hub files ---------------------------------------------------------------------


def hub_downloads(config: ModelConfig) -> dict[str, Download]:
    """What a replica of `config` fetches from a Hub before its engine loads: `source`, and a
    vision model's `vision.projector`, each that comes from a Hub, by the field it replaces."""
    downloads = {}
    if config.source is not None and config.source.hub is not None:
        downloads["source"] = Download(config.source, folder=config.backend == "vllm")
    projector = config.vision.projector if config.vision is not None else None
    if projector is not None and projector.hub is not None:
        downloads["projector"] = Download(projector, folder=False)
    return downloads


def fetch_hub_files(config: ModelConfig, downloads: dict[str, Download]) -> ModelConfig:
    """Fetch `downloads` onto this node (one after the other) and return `config` with each Hub
    source replaced by the local `path` it landed at, so the engine resolves the model and its
    projector alike, with `model_files.resolve_model_file`."""
    local = {field: ModelSource(path=str(d.run())) for field, d in downloads.items()}
    if "source" in local:
        config = config.model_copy(update={"source": local["source"]})
    if "projector" in local and config.vision is not None:
        vision = config.vision.model_copy(update={"projector": local["projector"]})
        config = config.model_copy(update={"vision": vision})
    return config


def fetch_adapter(source: ModelSource, backend: str) -> ModelSource:
    """A LoRA adapter from a Hub, fetched onto this node like a model (blocking): the local `path`
    it landed at, which `model_files.resolve_adapter` checks. A GGUF repository gives its one GGUF
    LoRA (`file` picks one of several) for llama.cpp, a PEFT repository its folder for vLLM (one
    repository may hold both: vLLM's download leaves GGUF files out when safetensors are there)."""
    return ModelSource(path=str(Download(source, folder=backend == "vllm").run()))


def fetch_adapters(config: ModelConfig) -> ModelConfig:
    """`config` with each of its adapters from a Hub fetched (`fetch_adapter`), before they load."""
    if not any(a.source.hub is not None for a in config.adapters):
        return config
    adapters = [
        a.model_copy(update={"source": fetch_adapter(a.source, config.backend)}) if a.source.hub else a
        for a in config.adapters
    ]
    return config.model_copy(update={"adapters": adapters})


def combined_progress(downloads: dict[str, Download]) -> DownloadProgress | None:
    """One reading for a replica's downloads (the model's, then its projector's): their files and
    bytes added up; done (and cached) when each is."""
    readings = [r for r in (d.progress() for d in downloads.values()) if r is not None]
    if not readings:
        return None
    return readings[0].model_copy(
        update={
            "files": [f for r in readings for f in r.files][:64],
            "bytes_done": sum(r.bytes_done for r in readings),
            "bytes_total": sum(r.bytes_total for r in readings),
            "bytes_per_s": round(sum(r.bytes_per_s for r in readings), 1),
            "done": all(r.done for r in readings) and len(readings) == len(downloads),
            "cached": all(r.cached for r in readings) and len(readings) == len(downloads),
        }
    )


def is_hub(source: Any) -> bool:
    return isinstance(source, ModelSource) and source.hub is not None
