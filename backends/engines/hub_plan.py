"""What a Hub source picks: the files of a repository at one commit (`HubPlan`), listed through
the Hugging Face Hub's or ModelScope's API, and the Hub libraries' exceptions turned into
`HubError`s that say what is wrong with the source.

A room of its own because both sides need it: the controller plans to pin a source at deploy
(`model_hub.pin`), and a replica plans again on its node before it fetches (`hub_download`).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from raygate.backends.engines.model_files import ModelFileError
from raygate.protocol.model_source import ModelSource

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# `name-00001-of-00003.gguf`: llama.cpp's split GGUF; loading the first shard loads them all.
SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
# Left out of a whole-repository (vLLM) download when the repository has safetensors weights.
NOT_FOR_VLLM = ("*.gguf", "*.bin", "*.pt", "*.pth", "*.msgpack", "*.h5", "*.onnx", "original/*", "onnx/*")
# A vision GGUF repository's multimodal projector: `mmproj-*.gguf`, `*-mmproj-f16.gguf`, ...
PROJECTOR = "mmproj"
PROJECTOR_GLOB = f"*{PROJECTOR}*.gguf"


class HubError(ModelFileError):
    """The source cannot be resolved or downloaded; the message says why (shown to the user)."""


@dataclass(frozen=True)
class HubFile:
    """One file of a pinned commit: its size, and the sha256 the Hub publishes (LFS files only)."""

    name: str
    size: int
    sha256: str | None = None
    blob: str = ""  # its name in the cache's blobs/ folder (the sha256 for LFS files, else the git oid)


@dataclass(frozen=True)
class HubPlan:
    """What a source resolves to at one commit: the files to fetch, the one to load first."""

    hub: str
    repo: str
    commit: str
    files: tuple[HubFile, ...]
    folder: bool

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]


# ---- picking files -----------------------------------------------------------------------------


def pick(names: list[str], pattern: str | None, *, folder: bool) -> list[str]:
    """The files of a repository that a source means.

    `folder` (vLLM): every file but other formats' weights. Otherwise one GGUF: the files matching
    `pattern` (a glob, case-insensitive, on the path or the file name; default `*.gguf`), which
    must be one file or the shards of one split GGUF (all of them are fetched, whichever matched).
    """
    if folder and pattern is not None:
        chosen = sorted(n for n in names if fnmatch.fnmatch(n, pattern))
        if not chosen:
            raise HubError(f"no file matches `{pattern}`")
        return chosen
    if folder:
        safetensors = any(n.endswith(".safetensors") for n in names)
        skip = NOT_FOR_VLLM if safetensors else ("*.gguf",)
        return [n for n in names if not any(fnmatch.fnmatch(n, p) for p in skip)]
    glob = (pattern or "*.gguf").lower()
    if PROJECTOR not in glob:  # a vision repository's projector is never the model (llama-server -hf)
        names = [n for n in names if PROJECTOR not in PurePosixPath(n).name.lower()]
    matches = sorted(
        n
        for n in names
        if fnmatch.fnmatch(n.lower(), glob) or fnmatch.fnmatch(PurePosixPath(n).name.lower(), glob)
    )
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    if not matches:
        hint = f"; its GGUF files: {', '.join(ggufs[:20])}" if ggufs else "; it holds no GGUF file"
        raise HubError(f"no file matches `{glob}`{hint}")
    sets = {_split_stem(n) or n for n in matches}
    if len(sets) > 1:
        raise HubError(
            f"`{glob}` matches {len(matches)} files; pick one with a narrower `file`: "
            + ", ".join(matches[:20])
        )
    stem = _split_stem(matches[0])
    if stem is None:
        return matches
    shards = sorted(n for n in names if _split_stem(n) == stem)
    count = int(SPLIT_GGUF.match(PurePosixPath(shards[0]).name).group("count"))  # type: ignore[union-attr]
    if len(shards) != count:
        raise HubError(f"split GGUF `{stem}` has {len(shards)} of its {count} shards in the repository")
    return shards


def _split_stem(name: str) -> str | None:
    match = SPLIT_GGUF.match(name)
    return match.group("stem") if match else None


def entry_file(plan: HubPlan, root: Path) -> Path:
    """What the engine loads: the folder (vLLM), or the GGUF (the first shard of a split one)."""
    return root if plan.folder else root / plan.files[0].name


# ---- Hugging Face Hub ---------------------------------------------------------------------------


def hf_error(exc: Exception, source: ModelSource) -> HubError:
    """What a huggingface_hub exception says about `source`, as the HubError the user is shown."""
    from huggingface_hub import errors

    where = f"`{source.repo}`" + (f" at `{source.revision}`" if source.revision else "")
    if isinstance(exc, errors.GatedRepoError):
        return HubError(f"Hugging Face repository {where} is gated: accept its terms and set HF_TOKEN")
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"Hugging Face repository `{source.repo}` has no revision `{source.revision}`")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"Hugging Face repository {where} was not found (or is private: set HF_TOKEN)")
    if isinstance(exc, errors.EntryNotFoundError):
        return HubError(f"Hugging Face repository {where}: {exc}".splitlines()[0])
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return HubError(f"HF_HUB_OFFLINE is set and {where} is not in this node's cache")
    return HubError(
        f"Hugging Face Hub, {where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    )


def transient(exc: Exception) -> bool:
    """A failure worth another try: the network, or the server's 5xx; never an answer about the
    repository itself (not found, gated, no such revision or file)."""
    from huggingface_hub import errors

    if isinstance(exc, errors.OfflineModeIsEnabled):
        return False
    if isinstance(exc, errors.LocalEntryNotFoundError):  # the Hub did not answer the file's HEAD
        return True
    answers = (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.EntryNotFoundError)
    if isinstance(exc, answers):
        return False
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        return exc.response.status_code >= 500 or exc.response.status_code in (408, 429)
    kind = type(exc).__name__.lower()
    return isinstance(exc, OSError | errors.LocalEntryNotFoundError) or any(
        word in kind for word in ("connect", "timeout", "protocol")
    )


def hf_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def plan_hf(source: ModelSource, *, folder: bool) -> HubPlan:
    """List `source` on the Hub (a network call) and pick its files at the commit its revision names."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    try:
        info = api.model_info(source.repo, revision=source.revision or "main")
        commit = str(info.sha)
        entries = [
            e
            for e in api.list_repo_tree(source.repo, revision=commit, recursive=True)
            if isinstance(e, RepoFile)
        ]
    except Exception as exc:
        raise hf_error(exc, source) from None
    by_name = {e.path: e for e in entries}
    try:
        chosen = pick(sorted(by_name), source.file, folder=folder)
    except HubError as exc:
        raise HubError(f"Hugging Face repository `{source.repo}`: {exc}") from None
    files = []
    for name in chosen:
        e = by_name[name]
        sha256 = e.lfs.sha256 if e.lfs is not None else None
        files.append(HubFile(name, int(e.size), sha256, sha256 or e.blob_id))
    return HubPlan("hf", source.repo, commit, tuple(files), folder)


# ---- ModelScope ---------------------------------------------------------------------------------


def plan_modelscope(source: ModelSource, *, folder: bool) -> HubPlan:
    """List `source` on ModelScope (a network call) and pick its files; the revision stays as
    given (ModelScope names releases by tag)."""
    try:
        from modelscope.hub.api import HubApi
    except ImportError:
        raise HubError(
            "`source: {modelscope: ...}` needs the `modelscope` package (pip install 'raygate[modelscope]')"
        ) from None

    revision = source.revision or "master"
    try:
        listing = HubApi().get_model_files(source.repo, revision=revision, recursive=True)
    except Exception as exc:
        raise HubError(f"ModelScope repository `{source.repo}` at `{revision}`: {exc}") from None
    sizes = {str(e["Path"]): int(e.get("Size") or 0) for e in listing if e.get("Type") != "tree"}
    try:
        chosen = pick(sorted(sizes), source.file, folder=folder)
    except HubError as exc:
        raise HubError(f"ModelScope repository `{source.repo}`: {exc}") from None
    return HubPlan("modelscope", source.repo, revision, tuple(HubFile(n, sizes[n]) for n in chosen), folder)
