"""Ray's start on a busy box: Ray 2.60's raylet gives its dashboard agent a fixed 15 s to report
its ports and aborts when the agent is late (a Python process importing much of Ray, starved by
whatever else runs). `raygate serve`'s embedded Ray (with Ray's own agents, `--ray-agents`) and
the test cluster's `ray start` start again; by default the embedded raylet runs Raygate's
stand-ins for its agents, which are never late.

The late agent is made, not waited for: a `sitecustomize` on the agents' PYTHONPATH holds the
first dashboard agent back 25 s, so the first raylet dies as it does under load, every time.
"""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from bench.servers import cmdline, descendants
from raygate.backends.cluster.runtime.connection import START_ATTEMPTS
from tests.support.cluster import LocalCluster
from tests.support.gateway import REPO, start_gateway

assert START_ATTEMPTS >= 2
EMBED_ONLY = REPO / "tests" / "configs" / "embed-only.yaml"

_LATE_AGENT = """
import os, sys, time
if any(a.endswith("dashboard/agent.py") for a in sys.argv):
    try:
        os.close(os.open({marker!r}, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
        time.sleep(25)
"""


def _late_first_agent(folder: Path) -> tuple[dict[str, str], Path]:
    """Environment that makes the first dashboard agent started under it 25 s late; and the file
    that says it was."""
    site = folder / "site"
    site.mkdir()
    marker = folder / "agent-was-late"
    (site / "sitecustomize.py").write_text(_LATE_AGENT.format(marker=str(marker)))
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}, marker


# Each failed start costs 30-90 s on two busy cores, and a busy box may fail more than the one
# start this test makes fail.
@pytest.mark.timeout(1200)
def test_embedded_ray_starts_again_when_its_raylet_dies_starting(tmp_path: Path) -> None:
    # With Ray's own agents (--ray-agents): Raygate's stand-ins for them import nothing and write
    # their ports at once, so they are never late.
    env, marker = _late_first_agent(tmp_path)
    gw = start_gateway(
        ["--config", str(EMBED_ONLY), "--ray-agents"],
        tmp_path / "gw.log",
        env=env,
        timeout=900,
    )
    try:
        assert marker.exists()
        assert "Ray's start failed (attempt 1 of" in gw.log(), gw.log()[-3000:]
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            assert len(client.embeddings.create(model="minilm", input="hi").data[0].embedding) == 384
    finally:
        code = gw.stop()
    assert code == 0, gw.log()[-3000:]


def test_embedded_ray_runs_only_what_raygate_uses(tmp_path: Path) -> None:
    """Issue #52: Ray's dashboard, autoscaler monitor and log monitor are gone, its agents stood in
    for (`agents.py`); the GCS, the raylet and the replicas serve."""
    gw = start_gateway(["--config", str(EMBED_ONLY)], tmp_path / "gw.log", timeout=900)
    try:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            assert len(client.embeddings.create(model="minilm", input="hi").data[0].embedding) == 384
        everything = [cmdline(pid) for pid in descendants(gw.proc.pid)]
        # The raylet's own command line names its agents' commands: the others are checked.
        processes = [c for c in everything if "--raylet_socket_name" not in c]
        assert len(everything) - len(processes) == 1, "no raylet"
        unused = [
            c
            for c in processes
            if any(name in c for name in ("dashboard/", "monitor.py", "DashboardAgent", "RuntimeEnvAgent"))
        ]
        assert not unused, "\n".join(c[:300] for c in unused)
        shown = " | ".join(c[:200] for c in processes)
        assert sum("agent_standin.py" in c for c in processes) == 2, shown
        assert any("gcs_server" in c for c in processes), shown
    finally:
        code = gw.stop()
    assert code == 0, gw.log()[-3000:]


@pytest.mark.timeout(1200)
def test_a_cluster_node_starts_again_when_its_raylet_dies_starting(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("rs", numbered=True)  # short: Ray's socket paths
    env, marker = _late_first_agent(root)
    cluster = LocalCluster(root, env=env)
    try:
        cluster.start_head(num_cpus=1, resources={})
        assert marker.exists()
        assert (root / "head.1.log").exists() and (root / "head.2.log").exists()
        assert len(cluster.nodes) == 1 and cluster.nodes[0].proc.poll() is None
        assert [n["id"] for n in cluster.alive_nodes()]
    finally:
        cluster.stop()
