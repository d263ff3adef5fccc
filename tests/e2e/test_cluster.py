"""A real two-node Ray cluster on this machine (a head, and a second raylet offering the custom
resource `side`), with two gateways attached to it.

A replica that asks for `side` lands on the second node; the replicas of a model that asks for no
custom resource stay off it (it offers `side`, which another model needs), even where Ray's own
policy would spread them there once the head is half busy; both gateways serve the same models from
the one controller; a model deployed through one gateway is served by the other; killing the second
node's raylet fails its replica cleanly and the deployment says why.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.admin import MINILM_PATH, deployments, embed_spec, settled_ready, wait_deployment
from tests.support.cluster import LocalCluster
from tests.support.gateway import GatewayProcess

# Bounds on a hang: the two nodes and two gateways start inside this test's budget, and on two
# busy cores a head's `ray start` took over 300 s.
pytestmark = pytest.mark.timeout(1800)
SEED = f"""
models:
  - name: cl-head           # no custom resource: 3 x 0.5 CPU, past half the head's 2 CPUs
    task: embed
    replicas: 3
    num_cpus: 0.5
    source: {{path: {MINILM_PATH}}}
    engine: {{n_ctx: 512, n_batch: 512, n_ubatch: 512}}
  - name: cl-side
    task: embed
    num_cpus: 0.25
    resources: {{side: 1}}
    source: {{path: {MINILM_PATH}}}
    engine: {{n_ctx: 512, n_batch: 512, n_ubatch: 512}}
"""


class TwoNodes:
    def __init__(self, cluster: LocalCluster, first: GatewayProcess, second: GatewayProcess) -> None:
        self.cluster, self.first, self.second = cluster, first, second


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    # Short root: Ray's unix socket paths must stay under ~107 characters.
    root = Path(tmp_path_factory.mktemp("rc", numbered=True))
    cluster = LocalCluster(root)
    gateways: list[GatewayProcess] = []
    try:
        cluster.start_head(num_cpus=2, resources={"main": 4})
        cluster.add_node("side", num_cpus=1, resources={"side": 1})
        seed = root / "seed.yaml"
        seed.write_text(SEED)
        gateways.extend(cluster.start_gateways(seed))
        yield TwoNodes(cluster, *gateways)
    finally:
        for gw in gateways:
            code = gw.stop()
            assert code == 0, gw.log()[-3000:]
        cluster.stop()


def test_two_gateways_then_losing_a_node(two_nodes: TwoNodes) -> None:
    """One test, in this order: the node loss ends the cluster that the first part uses, so as two
    tests a random order would break them."""
    placement_and_two_gateways_share_one_registry(two_nodes)
    losing_a_node_fails_its_replica_cleanly(two_nodes)


def placement_and_two_gateways_share_one_registry(two_nodes: TwoNodes) -> None:
    first, second = two_nodes.first, two_nodes.second
    nodes = two_nodes.cluster.alive_nodes()
    assert len(nodes) == 2
    side_node = next(n["id"] for n in nodes if "side" in n["resources"])  # type: ignore[operator]

    head_node = next(n["id"] for n in nodes if "main" in n["resources"])  # type: ignore[operator]

    listed = deployments(first.url)
    assert listed["cl-side"]["replicas"][0]["node_id"] == side_node
    assert [r["node_id"] for r in listed["cl-head"]["replicas"]] == [head_node] * 3
    assert listed == deployments(second.url)  # one registry, seen from both gateways

    for gw in (first, second):
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
            assert {m.id for m in client.models.list()} == {"cl-head", "cl-side"}
            for model in ("cl-head", "cl-side"):
                assert len(client.embeddings.create(model=model, input="hello").data[0].embedding) == 384

    # Deployed through the second gateway, served by the first; removed through the first.
    assert httpx.post(f"{second.url}/admin/deployments", json=embed_spec("cl-extra")).status_code == 202
    wait_deployment(first.url, "cl-extra", settled_ready(1))
    r = httpx.post(f"{first.url}/v1/embeddings", json={"model": "cl-extra", "input": "shared"})
    assert r.status_code == 200, r.text
    assert httpx.delete(f"{first.url}/admin/deployments/cl-extra").status_code == 200
    # The second gateway learns of it through its watch of the registry: wait for its own view.
    deadline = time.monotonic() + 30
    while httpx.get(f"{second.url}/v1/models/cl-extra").status_code != 404:
        assert time.monotonic() < deadline, "the second gateway still knows cl-extra"
        time.sleep(0.2)
    r = httpx.post(f"{second.url}/v1/embeddings", json={"model": "cl-extra", "input": "gone"})
    assert r.status_code == 404, r.text


def losing_a_node_fails_its_replica_cleanly(two_nodes: TwoNodes) -> None:
    first, second = two_nodes.first, two_nodes.second
    side = two_nodes.cluster.nodes[1]
    side.signal(signal.SIGKILL)  # the raylet and everything on that node die at once

    # Each gateway's own view (asking the controller refreshes that gateway's routes).
    status = wait_deployment(first.url, "cl-side", lambda s: s["state"] == "failed", timeout=90)
    wait_deployment(second.url, "cl-side", lambda s: s["state"] == "failed", timeout=90)
    replica = status["replicas"][0]
    assert replica["state"] == "failed"
    assert "node" in replica["error"] and "died" in replica["error"], replica["error"]
    # Not replaced: no alive node offers `side` any more, and the reason says so.
    assert "not replaced" in replica["error"] and "'side': 1.0" in replica["error"], replica["error"]
    assert status["restarts"] == 0

    for gw in (first, second):
        r = httpx.post(f"{gw.url}/v1/embeddings", json={"model": "cl-side", "input": "x"})
        assert r.status_code == 503 and "no ready replica" in r.json()["error"]["message"], r.text
        assert "cl-side" not in {m["id"] for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
        ok = httpx.post(f"{gw.url}/v1/embeddings", json={"model": "cl-head", "input": "still here"})
        assert ok.status_code == 200, ok.text
    assert deployments(second.url)["cl-side"]["state"] == "failed"
    side.kill_group()
