"""A Hub download cut mid-file resumes from the bytes already on the node, against real olah servers.

olah's mirror mode (tests/support/hub.py) sends a whole file whatever the request's `Range`, so
the server the downloads talk to here is olah in its proxy mode in front of that mirror, which
answers a `Range` with a 206 from the offset, as the Hub's CDN does. Its access log then says
which requests were ranged. The download runs as it does in a replica (`Download.fetch`, under
the node's lock), in a process of its own that the tests can kill; no Ray, no engine."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raygate.backends.engines.hub_cache import file_sha256
from raygate.backends.engines.hub_plan import HubFile, HubPlan
from tests.support.gateway import REPO
from tests.support.hub import OlahServer, commit_files, hf_env, lfs_object

REPO_ID = "raygate-tests/resume-GGUF"
SIZE = 40 << 20  # a whole number of MiB: olah's cache blocks are
WAIT_S = 300
# What a replica runs for a Hub source, once the plan is known: `Download.fetch`.
FETCH = """
import json, sys
from raygate.backends.engines.hub_download import Download
from raygate.backends.engines.hub_plan import HubFile, HubPlan
from raygate.protocol.model_source import ModelSource
spec = json.loads(sys.argv[1])
plan = HubPlan("hf", spec["repo"], spec["commit"], tuple(HubFile(**f) for f in spec["files"]), False)
print(Download(ModelSource(hf=spec["repo"], revision=spec["commit"]), folder=False).fetch(plan))
"""


@dataclass
class Servers:
    mirror: OlahServer
    proxy: OlahServer
    home: Path
    plans: dict[str, HubPlan]

    def partial(self, repo: str) -> Path:
        blob = self.plans[repo].files[0].blob
        return self.home / "hub" / f"models--{repo.replace('/', '--')}" / "raygate" / "partial" / blob

    def blob(self, repo: str) -> Path:
        blob = self.plans[repo].files[0].blob
        return self.home / "hub" / f"models--{repo.replace('/', '--')}" / "blobs" / blob

    def fetch(self, repo: str) -> subprocess.Popen[str]:
        plan = self.plans[repo]
        spec = {"repo": repo, "commit": plan.commit, "files": [f.__dict__ for f in plan.files]}
        env = {**os.environ, **hf_env(self.proxy.endpoint, self.home), "PYTHONPATH": str(REPO)}
        return subprocess.Popen(
            [sys.executable, "-c", FETCH, json.dumps(spec)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def gets(self, repo: str) -> list[str]:
        """The statuses olah's proxy answered the file's downloads with, in order (its access log)."""
        name = self.plans[repo].files[0].name
        return [
            line.rsplit('" ', 1)[1].split()[0]
            for line in self.proxy.log().splitlines()
            if f'"GET /{repo}/resolve/' in line and f"/{name} HTTP" in line
        ]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("hub-resume")
    # Any bytes do for a download (the engine never loads it): four of huggingface_hub's 10 MB
    # writes, so a download stopped after its first or second write has more to fetch.
    name, data = "weights-Q4_0.gguf", random.Random(44).randbytes(SIZE)
    mirror = OlahServer(root / "mirror")
    commit = commit_files(mirror.repo(REPO_ID), {name: data})
    oid = (mirror.repo(REPO_ID) / name).read_text().split("oid sha256:")[1].split()[0]
    assert lfs_object(mirror.repo(REPO_ID), oid).is_file()
    plans = {REPO_ID: HubPlan("hf", REPO_ID, commit, (HubFile(name, SIZE, oid, oid),), False)}
    proxy = OlahServer(root / "proxy", upstream=mirror, block_size=SIZE)  # one block: hub.py says why
    mirror.start()
    proxy.start()
    yield Servers(mirror, proxy, root / "hf-home", plans)
    proxy.stop()
    mirror.stop()


def wait_for_bytes(path: Path, proc: subprocess.Popen[str], beyond: int) -> None:
    """Until the download has written bytes past `beyond` (it then has most of the file to go)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if path.stat().st_size > beyond:
                return
        except OSError:
            pass
        time.sleep(0.001)
    raise AssertionError(
        f"no bytes in {path}; the download: {proc.poll()} {proc.stderr.read() if proc.stderr else ''}"
    )


def finished(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err[-3000:]
    return out.strip()


def test_a_download_cut_mid_file_resumes_from_the_bytes_on_the_node(servers: Servers) -> None:
    """Killed mid-file (what an undeploy does to a downloading replica), then the next download
    of the file loses the Hub for a few seconds: each time, the file is asked for again from where
    it stopped (206, a range), never whole again, and it verifies."""
    plan, partial = servers.plans[REPO_ID], servers.partial(REPO_ID)
    first = servers.fetch(REPO_ID)
    wait_for_bytes(partial, first, 0)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    killed_at = partial.stat().st_size
    assert 0 < killed_at < plan.total, killed_at

    second = servers.fetch(REPO_ID)
    wait_for_bytes(partial, second, killed_at)
    servers.proxy.stop()  # the connection drops mid-file; the Hub stays away for a while
    time.sleep(2)
    cut_at = partial.stat().st_size
    assert killed_at < cut_at < plan.total, (killed_at, cut_at)
    servers.proxy.start()
    path = Path(finished(second))

    assert path.resolve() == servers.blob(REPO_ID).resolve() and not partial.exists()
    assert file_sha256(path) == plan.files[0].sha256
    statuses = servers.gets(REPO_ID)
    assert statuses[0] == "200" and set(statuses[1:]) == {"206"}, statuses
