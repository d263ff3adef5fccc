"""Autoscaling and prefix-affinity routing on a real two-raylet Ray cluster with two gateways and the
synthetic engine (paced tokens, so the load is deterministic: N open streams = N ongoing requests).

The cluster offers three `slot`s (two on the head, one on the second raylet) and the autoscaled
model asks one per replica with `max_replicas: 4`: load from both gateways together grows it to
three (where there is room), never four; when the load stops it drains down to one, then to zero,
after the delays, with every request answered in full; a request at zero replicas is answered.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.admin import deployments, raygate, wait_deployment
from tests.support.cluster import LocalCluster
from tests.support.gateway import GatewayProcess

AUTOSCALING = (
    "{min_replicas: 0, max_replicas: 4, target_ongoing_requests: 1, upscale_delay_s: 0.2, "
    "downscale_delay_s: 0.6, downscale_to_zero_delay_s: 1.5}"
)
SEED = f"""
models:
  - name: auto
    backend: synthetic
    num_cpus: 0
    resources: {{slot: 1}}
    engine: {{token_ms: 20}}
    routing: {{policy: least_loaded}}
    autoscaling: {AUTOSCALING}
  - name: sticky
    backend: synthetic
    replicas: 2
    num_cpus: 0
    engine: {{token_ms: 20}}
    routing: {{policy: prefix_affinity, max_imbalance: 0}}
"""
# Bounds on a hang, for every test (in a shuffled order any of them may start the cluster): on two
# busy cores a head's `ray start` took over 300 s, and each replica is a Ray actor start.
pytestmark = pytest.mark.timeout(1800)
SYSTEM = "You are a careful assistant who answers briefly. " * 12  # ~600 characters


class Gateways:
    def __init__(self, first: GatewayProcess, second: GatewayProcess) -> None:
        self.first, self.second = first, second


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    root = Path(tmp_path_factory.mktemp("as", numbered=True))  # short: Ray's socket paths
    cluster = LocalCluster(root)
    started: list[GatewayProcess] = []
    try:
        cluster.start_head(num_cpus=2, resources={"slot": 2})
        cluster.add_node("side", num_cpus=1, resources={"slot": 1})
        seed = root / "seed.yaml"
        seed.write_text(SEED)
        started.extend(cluster.start_gateways(seed))
        yield Gateways(*started)
    finally:
        for gw in started:
            code = gw.stop()
            assert code == 0, gw.log()[-3000:]
        cluster.stop()


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", timeout=120, max_retries=0)


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_autoscaling_follows_load_from_every_gateway(gateways: Gateways) -> None:
    first, second = gateways.first, gateways.second
    status = deployments(first.url)["auto"]
    assert (status["desired"], status["ready"], status["autoscaled"]) == (0, 0, True)
    with _client(first) as client:
        assert "auto" in [m.id for m in client.models.list().data]  # at zero, still listed

    # A request at zero replicas waits while one starts, and is answered.
    with _client(second) as client:
        reply = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    assert reply.choices[0].finish_reason == "length" and reply.usage and reply.usage.completion_tokens == 3
    assert wait_deployment(first.url, "auto", lambda s: s["ready"] >= 1)["desired"] >= 1

    # Load rises: two long streams on each gateway, kept open until the deployment has grown.
    stop = threading.Event()
    results: list[tuple[str | None, int]] = []
    errors: list[BaseException] = []

    def keep_streaming(gw: GatewayProcess) -> None:
        with _client(gw) as client:
            while not stop.is_set():
                try:
                    with client.chat.completions.create(
                        model="auto", messages=[{"role": "user", "content": "go"}], max_tokens=60, stream=True
                    ) as stream:
                        chunks = [c for c in stream if c.choices]
                    text = "".join(c.choices[0].delta.content or "" for c in chunks)
                    results.append((chunks[-1].choices[0].finish_reason, len(text.split())))
                except BaseException as exc:  # recorded: the test fails on any lost request
                    errors.append(exc)
                    return

    workers = [threading.Thread(target=keep_streaming, args=(gw,)) for gw in (first, first, second, second)]
    for w in workers:
        w.start()
    try:
        grown = wait_deployment(first.url, "auto", lambda s: s["ready"] == 3, timeout=180)
        time.sleep(1.5)  # a few more autoscaler passes: it must not ask for a 4th, unplaceable one
        grown = deployments(second.url)["auto"]
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    assert not errors, errors
    # 4 ongoing / target 1 wants 4 (one gateway alone would see 2); the cluster has room for 3.
    assert grown["desired"] == 3 and len(grown["replicas"]) == 3, grown
    assert len({r["node_id"] for r in grown["replicas"]}) == 2  # both raylets host replicas
    assert results and all(reason == "length" and words == 60 for reason, words in results)

    # Load stops: down to one after downscale_delay_s, then to zero after downscale_to_zero_delay_s.
    idle = wait_deployment(first.url, "auto", lambda s: s["desired"] == 0 and not s["replicas"], timeout=120)
    steps = [(e["from_replicas"], e["to_replicas"]) for e in idle["scaling_events"]]
    assert (1, 0) in steps and steps[-1] == (1, 0)
    downs = steps[steps.index(max(steps, key=lambda s: s[0])) :]
    assert all(b < a for a, b in downs), steps  # shrinking in steps, never cut below what is asked
    assert _metric(first.url, "raygate:replicas_desired", model_name="auto") == 0
    assert _metric(first.url, "raygate:scaling_events_total", model_name="auto") >= len(steps)

    # From zero again: answered.
    with _client(first) as client:
        again = client.completions.create(model="auto", prompt="hello", max_tokens=2)
    assert again.choices[0].finish_reason == "length"

    listing = httpx.get(f"{first.url}/admin/deployments", timeout=30).json()["data"]
    shown = next(d for d in listing if d["name"] == "auto")
    assert shown["routing"] == "least_loaded" and "replicas" not in shown["spec"]
    cli = raygate("list", url=first.url)
    assert cli.returncode == 0, cli.stderr
    row = next(line.split() for line in cli.stdout.splitlines() if line.startswith("auto "))
    assert row[4:6] == ["-", "least_loaded"] and row[6].startswith("auto:0-4,ongoing="), row
    assert "scaled" in cli.stdout and "1 -> 0" in cli.stdout


def _sticky_chat(gw: GatewayProcess, user: str, max_tokens: int = 2) -> None:
    with _client(gw) as client:
        reply = client.chat.completions.create(
            model="sticky",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            max_tokens=max_tokens,
        )
    assert reply.choices[0].finish_reason == "length"


def test_prefix_affinity_hits_then_falls_back_under_load(gateways: Gateways) -> None:
    gw = gateways.first
    hits = _metric(gw.url, "raygate:routing_affinity_total", model_name="sticky", outcome="hit")
    for i in range(4):  # one at a time: the replica that served the system prompt gets them all
        _sticky_chat(gw, f"question {i}")
    after = _metric(gw.url, "raygate:routing_affinity_total", model_name="sticky", outcome="hit")
    assert after - hits >= 3

    # A long request holds the preferred replica; with max_imbalance 0 the next one falls back.
    fallbacks = _metric(gw.url, "raygate:routing_affinity_total", model_name="sticky", outcome="fallback")
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_sticky_chat, gw, "question 0", 150)
        time.sleep(1.0)
        _sticky_chat(gw, "question 1")
        long.result(timeout=120)
    assert (
        _metric(gw.url, "raygate:routing_affinity_total", model_name="sticky", outcome="fallback") > fallbacks
    )


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 1}}, ["min_replicas", "max_replicas"]),
        ({"autoscaling": {"max_replicas": 2, "downscale_delay_s": -1}}, ["downscale_delay_s"]),
        ({"replicas": 2, "autoscaling": {"max_replicas": 2}}, ["replicas", "autoscaling"]),
    ],
)
def test_bad_autoscaling_is_a_400_naming_the_fields(
    gateways: Gateways, change: dict[str, Any], fields: list[str]
) -> None:
    url = gateways.second.url
    before = {name: d["spec"] for name, d in deployments(url).items()}
    body = {"name": "bad-auto", "backend": "synthetic", "num_cpus": 0, **change}
    r = httpx.post(f"{url}/admin/deployments", json=body, timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert all(re.search(rf"\b{f}\b", message) for f in fields), message
    # The same change as an update of an existing deployment is refused too.
    spec = {k: v for k, v in before["sticky"].items() if k != "replicas"} | change
    r = httpx.put(f"{url}/admin/deployments/sticky", json=spec, timeout=30)
    assert r.status_code == 400, r.text
    assert {name: d["spec"] for name, d in deployments(url).items()} == before


def test_scaling_an_autoscaled_deployment_by_hand_is_refused(gateways: Gateways) -> None:
    r = httpx.patch(f"{gateways.first.url}/admin/deployments/auto", json={"replicas": 2}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "replicas", r.text
