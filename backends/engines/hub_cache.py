"""Where a Hub source's files sit on this node: the Hugging Face cache's folder for a repository,
the marker recording a verified copy of a commit's files, the partial files a cut download
resumes from, and a file's sha256.

A room of its own because it is the on-disk layout, which the download writes and its progress
reads (`hub_download`), apart from how the bytes get there.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from raygate.backends.engines.hub_plan import COMMIT, HubFile, HubPlan
from raygate.protocol.model_source import ModelSource

MARKER_DIR = "raygate"
HASH_BLOCK = 1 << 20


def hf_repo_cache(repo: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")


def local_commit(repo_cache: Path, revision: str | None, default: str) -> str | None:
    """The commit a revision names in this node's cache (a commit is itself; a branch or tag is
    what `refs/` recorded when it was last resolved here)."""
    rev = revision or default
    if COMMIT.fullmatch(rev):
        return rev
    ref = repo_cache / "refs" / rev
    return ref.read_text().strip() if ref.is_file() else None


def marker_path(repo_cache: Path, commit: str, source: ModelSource, folder: bool) -> Path:
    """Where a node records that it holds a verified copy of what `source` picks at `commit`."""
    selection = hashlib.sha1(f"{source.file or ''}|{folder}".encode()).hexdigest()[:12]
    return repo_cache / MARKER_DIR / f"{commit}-{selection}.json"


def write_marker(repo_cache: Path, plan: HubPlan, source: ModelSource) -> None:
    marker = marker_path(repo_cache, plan.commit, source, plan.folder)
    marker.parent.mkdir(parents=True, exist_ok=True)
    body = {"files": [f.__dict__ for f in plan.files], "verified_at": time.time()}
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, marker)


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # renamed into place, or removed, since the listing
        return 0


def partial_path(repo_cache: Path, f: HubFile) -> Path:
    """Where this node keeps the bytes of `f` fetched so far, across calls, replicas and restarts."""
    return repo_cache / MARKER_DIR / "partial" / f.blob


def drop_partials(repo_cache: Path, plan: HubPlan) -> None:
    """Remove the library's `.incomplete` files that killed downloads left (a replica undeployed
    mid-file is killed, so the library's clean-up never ran): huggingface_hub 2.x never reuses
    them (each call has its own). Raygate's own partial files (`partial_path`) are kept: they resume.
    Called under the node's lock for the repository, so no download of ours is writing them."""
    for f in plan.files:
        for partial in (repo_cache / "blobs").glob(f"{f.blob}.*incomplete"):
            partial.unlink(missing_ok=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()
