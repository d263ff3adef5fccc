"""One replica's fetch of a Hub source onto its node (`Download`): under the node's lock for the
repository, resumed from the bytes the node holds, retried while the Hub is away, each file
checked against the Hub's sha256, and the progress it reports meanwhile.

A room of its own because it is the one part that runs on the replica's node and writes there;
what to fetch is `hub_plan`, where it lands `hub_cache`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from raygate.backends.engines.hub_cache import (
    MARKER_DIR,
    drop_partials,
    file_sha256,
    hf_repo_cache,
    local_commit,
    marker_path,
    partial_path,
    size_of,
    write_marker,
)
from raygate.backends.engines.hub_plan import (
    COMMIT,
    HubError,
    HubFile,
    HubPlan,
    entry_file,
    hf_error,
    hf_offline,
    plan_hf,
    plan_modelscope,
    transient,
)
from raygate.protocol.admin import DownloadProgress
from raygate.protocol.model_source import ModelSource

# An outage longer than huggingface_hub's own retries (about five, a second apart) costs one of
# these; each resumes from the partial file. Only failures in a row without progress count, and
# they wait longer each time (3, 6, 12, 24, 30 s): a Hub away for about a minute and a half is
# waited for, one that stays away fails the replica with the reason.
FETCH_ATTEMPTS = 6
FETCH_RETRY_SECONDS = 3.0
FETCH_RETRY_MAX_SECONDS = 30.0


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
        partial = [size_of(partial_path(repo_cache, f))]
        partial += [size_of(p) for p in blobs.glob(f"{f.blob}.*incomplete")]
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
            if marker_path(repo_cache, plan.commit, self.source, self.folder).is_file():
                self.done = self.cached = True
                return entry_file(plan, root)
            drop_partials(repo_cache, plan)
            self._check_disk(repo_cache)
            for f in plan.files:
                self._fetch_hf_file(f)
            write_marker(repo_cache, plan, self.source)
        self.done = True
        return entry_file(plan, root)

    def _verified_local(self, repo_cache: Path) -> Path | None:
        """The files, when this node fetched and verified them before at the commit the revision
        names here: no network call at all. A branch or tag (a `models.yaml` seed; deploys pin
        a commit) is read from the cache's `refs/` only offline: online it may have moved."""
        if not (self.source.revision and COMMIT.fullmatch(self.source.revision)) and not hf_offline():
            return None
        commit = local_commit(repo_cache, self.source.revision, "main")
        if commit is None:
            return None
        marker = marker_path(repo_cache, commit, self.source, self.folder)
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
                if failures >= FETCH_ATTEMPTS or not transient(exc):
                    raise hf_error(exc, self.source) from None
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
            partial = partial_path(repo_cache, f)
            partial.parent.mkdir(parents=True, exist_ok=True)
            have = size_of(partial)
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
        digest = file_sha256(path)
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


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
