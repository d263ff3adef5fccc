"""A Hub download cut mid-file resumes from the bytes already on the node, against real olah servers.

olah's mirror mode (tests/support/hub.py) sends a whole file whatever the request's `Range`, so
the server the downloads talk to here is olah in its proxy mode in front of that mirror, which
answers a `Range` with a 206 from the offset, as the Hub's CDN does. Its access log then says
which requests were ranged. The download runs as it does in a replica (`Download.fetch`, under
the node's lock), in a process of its own that the tests can kill; no Ray, no engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raygate.backends.engines.model_hub import HubFile, HubPlan, _sha256
from tests.support.gateway import REPO
from tests.support.hub import OlahServer, commit_files, hf_env, lfs_object, smollm2_gguf

CUT_REPO = "raygate-tests/resume-cut-GGUF"  # the server dies mid-file and comes back
KILL_REPO = "raygate-tests/resume-kill-GGUF"  # the downloading process is killed mid-file
MIB = 1 << 20
WAIT_S = 300
# What a replica runs for a Hub source, once the plan is known: `Download.fetch`.
FETCH = """
import json, sys
from raygate.backends.engines.model_hub import Download, HubFile, HubPlan
from raygate.protocol.config import ModelSource
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
    gguf = smollm2_gguf()
    mirror = OlahServer(root / "mirror")
    plans = {}
    for repo in (CUT_REPO, KILL_REPO):
        commit = commit_files(mirror.repo(repo), {gguf.name: gguf})
        oid = (mirror.repo(repo) / gguf.name).read_text().split("oid sha256:")[1].split()[0]
        assert lfs_object(mirror.repo(repo), oid).is_file()
        size = gguf.stat().st_size
        plans[repo] = HubPlan("hf", repo, commit, (HubFile(gguf.name, size, oid, oid),), False)
    block = -(-gguf.stat().st_size // MIB) * MIB  # one cache block holds the file (hub.py says why)
    proxy = OlahServer(root / "proxy", upstream=mirror, block_size=block)
    mirror.start()
    proxy.start()
    yield Servers(mirror, proxy, root / "hf-home", plans)
    proxy.stop()
    mirror.stop()


def wait_for_bytes(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until the download has written its first bytes (it then has most of the file to go)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if path.stat().st_size > 0:
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


def test_a_download_resumes_after_the_hub_was_gone_for_a_while(servers: Servers) -> None:
    size = servers.plans[CUT_REPO].total
    proc = servers.fetch(CUT_REPO)
    wait_for_bytes(servers.partial(CUT_REPO), proc)
    servers.proxy.stop()  # the connection drops mid-file; the Hub stays away for a few seconds
    time.sleep(2)
    kept = servers.partial(CUT_REPO).stat().st_size
    assert 0 < kept < size, kept
    servers.proxy.start()
    path = Path(finished(proc))
    assert _sha256(path) == servers.plans[CUT_REPO].files[0].sha256
    # The first request took the file from its start; after the outage it was asked for from
    # where it stopped (206: a range), never whole again.
    statuses = servers.gets(CUT_REPO)
    assert statuses[0] == "200" and statuses[-1] == "206" and statuses.count("200") == 1, statuses
    assert not servers.partial(CUT_REPO).exists()


def test_a_download_killed_mid_file_is_resumed_by_the_next_one(servers: Servers) -> None:
    size = servers.plans[KILL_REPO].total
    proc = servers.fetch(KILL_REPO)
    wait_for_bytes(servers.partial(KILL_REPO), proc)
    proc.send_signal(signal.SIGKILL)  # what an undeploy does to a downloading replica
    proc.communicate(timeout=30)
    kept = servers.partial(KILL_REPO).stat().st_size
    assert 0 < kept < size, kept
    again = servers.fetch(KILL_REPO)
    path = Path(finished(again))
    assert path.resolve() == servers.blob(KILL_REPO).resolve()
    assert _sha256(path) == servers.plans[KILL_REPO].files[0].sha256
    statuses = servers.gets(KILL_REPO)
    assert statuses == ["200", "206"], statuses
