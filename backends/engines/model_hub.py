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
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from raygate.backends.engines.model_files import ModelFileError
from raygate.protocol.admin import DownloadProgress
from raygate.protocol.config import ModelConfig, ModelSource

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# `name-00001-of-00003.gguf`: llama.cpp's split GGUF; loading the first shard loads them all.
SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
# Left out of a whole-repository (vLLM) download when the repository has safetensors weights.
NOT_FOR_VLLM = ("*.gguf", "*.bin", "*.pt", "*.pth", "*.msgpack", "*.h5", "*.onnx", "original/*", "onnx/*")
MARKER_DIR = "raygate"
# A vision GGUF repository's multimodal projector: `mmproj-*.gguf`, `*-mmproj-f16.gguf`, ...
PROJECTOR = "mmproj"
PROJECTOR_GLOB = f"*{PROJECTOR}*.gguf"
HASH_BLOCK = 1 << 20
# An outage longer than huggingface_hub's own retries (about five, a second apart) costs one of
# these; each resumes from the partial file. Only failures in a row without progress count, and
# they wait longer each time (3, 6, 12, 24, 30 s): a Hub away for about a minute and a half is
# waited for, one that stays away fails the replica with the reason.
FETCH_ATTEMPTS = 6
FETCH_RETRY_SECONDS = 3.0
FETCH_RETRY_MAX_SECONDS = 30.0


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


def _hf_errors(exc: Exception, source: ModelSource) -> HubError:
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


def _transient(exc: Exception) -> bool:
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
        raise _hf_errors(exc, source) from None
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


def hf_repo_cache(repo: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")


def _local_commit(repo_cache: Path, revision: str | None, default: str) -> str | None:
    """The commit a revision names in this node's cache (a commit is itself; a branch or tag is
    what `refs/` recorded when it was last resolved here)."""
    rev = revision or default
    if COMMIT.fullmatch(rev):
        return rev
    ref = repo_cache / "refs" / rev
    return ref.read_text().strip() if ref.is_file() else None


# ---- the download ------------------------------------------------------------------------------


@dataclass
class Download:
    """One replica's fetch of a Hub source, and the progress it reports while it runs."""

    source: ModelSource
    folder: bool
    plan: HubPlan | None = None
    started: float = field(default_factory=time.monotonic)
    first_bytes: int | None = None
    done: bool = False
    cached: bool = False

    def progress(self) -> DownloadProgress | None:
        """Bytes on disk of the planned files (finished or `.incomplete`), and the mean rate since
        this replica started measuring. None before the plan is known."""
        plan = self.plan
        if plan is None:
            return None
        done = plan.total if self.done else min(plan.total, self._bytes_on_disk(plan))
        if self.first_bytes is None:
            self.first_bytes = done
        elapsed = max(1e-3, time.monotonic() - self.started)
        return DownloadProgress(
            hub=plan.hub,
            repo=plan.repo,
            revision=plan.commit,
            files=plan.names[:64],
            bytes_done=done,
            bytes_total=plan.total,
            bytes_per_s=round(max(0, done - self.first_bytes) / elapsed, 1),
            done=self.done,
            cached=self.cached,
        )

    def _bytes_on_disk(self, plan: HubPlan) -> int:
        if plan.hub != "hf":
            return 0
        return sum(self._file_bytes(plan, f) for f in plan.files)

    @staticmethod
    def _file_bytes(plan: HubPlan, f: HubFile) -> int:
        """Bytes of `f` on this node: the blob, else Raygate's resumable partial, else
        huggingface_hub's own `<blob>.<random>.incomplete` (a Xet download, one per call)."""
        repo_cache = hf_repo_cache(plan.repo)
        blobs = repo_cache / "blobs"
        try:
            return min(f.size, (blobs / f.blob).stat().st_size)
        except OSError:
            pass
        partial = [_size_of(_partial(repo_cache, f))]
        partial += [_size_of(p) for p in blobs.glob(f"{f.blob}.*incomplete")]
        return min(f.size, max(partial))

    def run(self) -> Path:
        """Fetch (or find) the files on this node and return what the engine loads."""
        if self.source.hub == "modelscope":
            return self._run_modelscope()
        return self._run_hf()

    def _run_hf(self) -> Path:

        repo_cache = hf_repo_cache(self.source.repo)
        local = self._verified_local(repo_cache)
        if local is not None:
            return local
        if hf_offline():
            raise HubError(
                f"HF_HUB_OFFLINE is set and this node's cache ({repo_cache}) holds no verified copy of "
                f"`{self.source.repo}`" + (f" at `{self.source.revision}`" if self.source.revision else "")
            )
        return self.fetch(plan_hf(self.source, folder=self.folder))

    def fetch(self, plan: HubPlan) -> Path:
        """Fetch `plan`'s files into this node's cache under the node's lock for the repository
        (resuming what an earlier download left), verify them, mark them verified, and return
        what the engine loads."""
        from filelock import FileLock

        self.plan = plan
        repo_cache = hf_repo_cache(plan.repo)
        lock_dir = repo_cache.parent / ".locks" / MARKER_DIR
        lock_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_dir / f"{repo_cache.name}.lock")):
            root = repo_cache / "snapshots" / plan.commit
            if _marker(repo_cache, plan.commit, self.source, self.folder).is_file():
                self.done = self.cached = True
                return entry_file(plan, root)
            _drop_partials(repo_cache, plan)
            self._check_disk(repo_cache)
            for f in plan.files:
                self._fetch_hf_file(f)
            _write_marker(repo_cache, plan, self.source)
        self.done = True
        return entry_file(plan, root)

    def _verified_local(self, repo_cache: Path) -> Path | None:
        """The files, when this node fetched and verified them before at the commit the revision
        names here: no network call at all. A branch or tag (a `models.yaml` seed; deploys pin
        a commit) is read from the cache's `refs/` only offline: online it may have moved."""
        if not (self.source.revision and COMMIT.fullmatch(self.source.revision)) and not hf_offline():
            return None
        commit = _local_commit(repo_cache, self.source.revision, "main")
        if commit is None:
            return None
        marker = _marker(repo_cache, commit, self.source, self.folder)
        try:
            recorded = json.loads(marker.read_text())
            files = tuple(HubFile(**f) for f in recorded["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        root = repo_cache / "snapshots" / commit
        if not all((root / f.name).is_file() for f in files):
            return None
        self.plan = HubPlan("hf", self.source.repo, commit, files, self.folder)
        self.done = self.cached = True
        return entry_file(self.plan, root)

    def _check_disk(self, repo_cache: Path) -> None:
        assert self.plan is not None
        repo_cache.mkdir(parents=True, exist_ok=True)
        needed = max(0, self.plan.total - self._bytes_on_disk(self.plan))
        free = shutil.disk_usage(repo_cache).free
        if needed > free:
            raise HubError(
                f"not enough disk for `{self.plan.repo}` in {repo_cache}: {_size(needed)} needed, "
                f"{_size(free)} free"
            )

    def _fetch_hf_file(self, f: HubFile) -> None:
        """One file, retried while the Hub is unreachable: `FETCH_ATTEMPTS` failures in a row
        without a byte of progress give up (a download that keeps moving is never abandoned)."""
        assert self.plan is not None
        failures = 0
        while True:
            before = self._file_bytes(self.plan, f)
            try:
                self._fetch_hf_once(f)
                return
            except HubError:
                raise
            except Exception as exc:
                failures = 0 if self._file_bytes(self.plan, f) > before else failures + 1
                if failures >= FETCH_ATTEMPTS or not _transient(exc):
                    raise _hf_errors(exc, self.source) from None
                time.sleep(min(FETCH_RETRY_MAX_SECONDS, FETCH_RETRY_SECONDS * 2 ** max(0, failures - 1)))

    def _fetch_hf_once(self, f: HubFile) -> None:
        """Resume `f` from the bytes this node already holds, then let huggingface_hub link it.

        huggingface_hub 2.x resumes within one call only (its `http_get` retries with a `Range`
        request), and deletes its per-call `.incomplete` file when the call fails; a replica killed
        mid-file leaves nothing it would reuse. So the bytes go into a partial file of ours
        (`models--ORG--REPO/raygate/partial/<blob>`, written only under the node's lock), which the
        library's own `http_get` continues with a `Range` request from its size (a server that
        ignores ranges answers 200: `http_get` then starts the file over). Once whole and verified
        it becomes the cache's blob, and `hf_hub_download` finds it there and only links it into
        the snapshot. Xet-stored files, when `hf_xet` is installed, go through the library's own
        Xet download instead."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils._headers import build_hf_headers
        from huggingface_hub.utils._runtime import is_xet_available

        assert self.plan is not None
        repo_cache = hf_repo_cache(self.plan.repo)
        url = hf_hub_url(self.plan.repo, f.name, revision=self.plan.commit)
        meta = get_hf_file_metadata(url)
        blob = repo_cache / "blobs" / (meta.etag or f.blob)
        verified = False
        if not blob.is_file() and not (meta.xet_file_data is not None and is_xet_available()):
            partial = _partial(repo_cache, f)
            partial.parent.mkdir(parents=True, exist_ok=True)
            have = _size_of(partial)
            if have > f.size:  # not a prefix of this file: start over
                partial.unlink(missing_ok=True)
                have = 0
            headers = build_hf_headers()
            location = meta.location or url
            if urlparse(location).netloc != urlparse(url).netloc:
                headers.pop("authorization", None)  # a CDN gets no token (as hf_hub_download does)
            with partial.open("ab") as out:
                http_get(location, out, resume_size=have, headers=headers, expected_size=meta.size or f.size)
            self._verify(f, partial)
            blob.parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial, blob)
            verified = True
        path = Path(hf_hub_download(self.plan.repo, f.name, revision=self.plan.commit))
        if not verified:
            self._verify(f, path)

    def _verify(self, f: HubFile, path: Path) -> None:
        """Compare `path` with the sha256 the Hub lists for `f` (LFS files); a mismatch deletes it
        (and the blob a snapshot link points at) and fails the load."""
        assert self.plan is not None
        if f.sha256 is None:
            return
        digest = _sha256(path)
        if digest == f.sha256:
            return
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise HubError(
            f"`{f.name}` of `{self.plan.repo}` does not match the Hub's sha256 (expected {f.sha256}, "
            f"got {digest}); the file was deleted"
        )

    def _run_modelscope(self) -> Path:
        """ModelScope through its own library and cache (`MODELSCOPE_CACHE`); its downloads verify
        each file's sha256 themselves."""
        from filelock import FileLock
        from modelscope import snapshot_download
        from modelscope.utils.file_utils import get_model_cache_root

        self.plan = plan_modelscope(self.source, folder=self.folder)
        revision, chosen = self.plan.commit, self.plan.names

        lock_dir = Path(get_model_cache_root()) / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_dir / f"{self.source.repo.replace('/', '--')}.lock")):
            try:
                root = Path(snapshot_download(self.source.repo, revision=revision, allow_patterns=chosen))
            except Exception as exc:
                raise HubError(f"ModelScope repository `{self.source.repo}`: {exc}") from None
        self.done = True
        return entry_file(self.plan, root)


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


def _marker(repo_cache: Path, commit: str, source: ModelSource, folder: bool) -> Path:
    """Where a node records that it holds a verified copy of what `source` picks at `commit`."""
    selection = hashlib.sha1(f"{source.file or ''}|{folder}".encode()).hexdigest()[:12]
    return repo_cache / MARKER_DIR / f"{commit}-{selection}.json"


def _write_marker(repo_cache: Path, plan: HubPlan, source: ModelSource) -> None:
    marker = _marker(repo_cache, plan.commit, source, plan.folder)
    marker.parent.mkdir(parents=True, exist_ok=True)
    body = {"files": [f.__dict__ for f in plan.files], "verified_at": time.time()}
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, marker)


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # renamed into place, or removed, since the listing
        return 0


def _partial(repo_cache: Path, f: HubFile) -> Path:
    """Where this node keeps the bytes of `f` fetched so far, across calls, replicas and restarts."""
    return repo_cache / MARKER_DIR / "partial" / f.blob


def _drop_partials(repo_cache: Path, plan: HubPlan) -> None:
    """Remove the library's `.incomplete` files that killed downloads left (a replica undeployed
    mid-file is killed, so the library's clean-up never ran): huggingface_hub 2.x never reuses
    them (each call has its own). Raygate's own partial files (`_partial`) are kept: they resume.
    Called under the node's lock for the repository, so no download of ours is writing them."""
    for f in plan.files:
        for partial in (repo_cache / "blobs").glob(f"{f.blob}.*incomplete"):
            partial.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


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
    return cause is not None and isinstance(cause, Exception) and _transient(cause)


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
