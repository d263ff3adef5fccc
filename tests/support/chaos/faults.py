"""The chaos run's faults, one kind after another on a schedule, each timed until the cluster has
healed: every deployment ready at its desired size and every gateway ready again.

Processes are found the way an operator would find them, by walking each node's process tree: the
controller is `ray::Controller`, a replica is a `ModelWorker` that maps its model's weights.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.servers import cmdline, descendants, maps_file
from tests.support.chaos.traffic import SILENT, Outcome, Traffic, broken, client_for, completion
from tests.support.cluster import LocalCluster
from tests.support.gateway import GatewayProcess, start_gateway

HEAL_TIMEOUT_S = 600.0
EMBED_APIS = ("embeddings", "rerank", "ollama embed")  # the APIs on the autoscaled embedding model


@dataclass
class Window:
    """One fault: when it was injected, and when the cluster had healed (None: it never did)."""

    fault: str
    started: float
    healed: float | None = None
    note: str = ""

    @property
    def heal_s(self) -> float | None:
        return None if self.healed is None else self.healed - self.started


@dataclass
class Chaos:
    """What the faults act on: the cluster, its gateways (swapped as they restart), the traffic."""

    cluster: LocalCluster
    side_resources: dict[str, float]
    gateways: list[GatewayProcess]
    gateway_args: list[str]
    root: Path
    traffic: Traffic
    weights: dict[str, Path]  # model name -> its weights file (names its replicas)
    rng: random.Random
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    restarts: int = 0

    # -- looking --------------------------------------------------------------------------------

    def roots(self) -> list[int]:
        return [node.proc.pid for node in self.cluster.nodes if node.proc.poll() is None]

    def processes(self, marker: str, model: str | None = None) -> list[int]:
        found = []
        for root in self.roots():
            for pid in descendants(root):
                if marker in cmdline(pid) and (model is None or maps_file(pid, self.weights[model])):
                    found.append(pid)
        return found

    async def deployments(self) -> dict[str, dict[str, Any]]:
        async with httpx.AsyncClient(headers=self.traffic.headers, timeout=30) as c:
            r = await c.get(f"{self.gateways[0].url}/admin/deployments")
            r.raise_for_status()
            return {d["name"]: d for d in r.json()["data"]}

    async def healthy(self) -> bool:
        """Every deployment ready at its desired size (at least one, unless autoscaled), every
        gateway ready."""
        try:
            listed = await self.deployments()
            async with httpx.AsyncClient(timeout=10) as c:
                ready = [(await c.get(f"{gw.url}/ready")).status_code == 200 for gw in self.gateways]
        except (httpx.HTTPError, ValueError):
            return False
        settled = all(
            d["state"] == "ready"
            and not d["updating"]
            and d["ready"] == d["desired"]
            and (d["desired"] >= 1 or d["autoscaled"])  # an autoscaled model may rest at zero
            for d in listed.values()
        )
        return settled and all(ready)

    async def heal(self, window: Window) -> None:
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        while time.monotonic() < deadline:
            if await self.healthy():
                window.healed = time.monotonic()
                return
            await asyncio.sleep(1)

    # -- the faults -----------------------------------------------------------------------------

    async def replica_sigkill(self) -> str:
        victims = self.processes("ModelWorker", "chaos-chat")
        victim = self.rng.choice(victims)
        os.kill(victim, signal.SIGKILL)
        return f"pid {victim} of {len(victims)} chat replicas"

    async def node_killed_and_back(self) -> str:
        side = self.cluster.nodes[1]
        side.signal(signal.SIGKILL)  # the raylet and everything on it at once
        await asyncio.to_thread(side.stop)  # reaps it and closes its log
        self.cluster.nodes.remove(side)
        await asyncio.sleep(10)  # the cluster notices the node is gone (health checks, ~2 s)
        # As an operator would: the node is started again until it is back (a raylet start can fail
        # on a starved machine), and the fault's window stays open until then.
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        for tries in itertools.count(1):
            try:
                await asyncio.to_thread(self.cluster.add_node, "side", 1, self.side_resources)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(10)
                continue
            return f"side node SIGKILLed, a new raylet with its resources 10 s later ({tries} tries)"
        raise AssertionError("unreachable")

    async def controller_killed(self) -> str:
        (victim,) = self.processes("ray::Controller")
        os.kill(victim, signal.SIGKILL)
        return f"controller pid {victim}"

    async def gateway_restarted(self) -> str:
        index = 1 if len(self.gateways) > 1 else 0
        old = self.gateways[index]
        code = await asyncio.to_thread(old.stop)  # SIGTERM: drains its streams, then exits
        self.restarts += 1
        log = self.root / f"gw-restart{self.restarts}.log"
        new = await asyncio.to_thread(start_gateway, self.gateway_args, log, None, 900)
        self.gateways[index] = new
        self.traffic.gateways[index] = new.url
        return f"{old.url} exited {code}; back as {new.url}"

    async def rolling_update(self) -> str:
        spec = (await self.deployments())["chaos-chat"]["spec"]
        engine = dict(spec["engine"])
        engine["n_ctx"] = 1536 if engine.get("n_ctx") == 1024 else 1024
        async with httpx.AsyncClient(headers=self.traffic.headers, timeout=60) as c:
            r = await c.put(
                f"{self.gateways[0].url}/admin/deployments/chaos-chat", json={**spec, "engine": engine}
            )
        return f"PUT n_ctx={engine['n_ctx']}: {r.status_code}"

    async def scale_to_zero_and_back(self) -> str:
        """No embeddings (nor reranks, on the same model) for a while, so the autoscaled embedding
        model goes to zero replicas; then the clients send them again, and the first ones wait for
        a replica to start."""
        self.traffic.paused.update(EMBED_APIS)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if (await self.deployments())["chaos-embed"]["ready"] == 0:
                    break
                await asyncio.sleep(1)
            else:
                return "did not reach zero replicas within 120 s"
        finally:
            self.traffic.paused.difference_update(EMBED_APIS)
        return "chaos-embed at 0 replicas, then requested again"

    async def reader_stops(self) -> str:
        """A client that asks for a long stream and stops reading: the gateway must keep serving
        everyone else, and let the stream go when the client finally leaves."""
        body = {"model": "chaos-chat", "prompt": "Tell a long story", "max_tokens": 512, "stream": True}
        async with (
            httpx.AsyncClient(headers=self.traffic.headers, timeout=60) as c,
            c.stream("POST", f"{self.gateways[0].url}/v1/completions", json=body) as r,
        ):
            await asyncio.sleep(30)  # headers read; the body is never read
            return f"status {r.status_code}, left unread for 30 s"

    async def burst(self) -> str:
        """48 requests at once on top of the clients: past the chat model's queue limit."""
        traffic = Traffic([gw.url for gw in self.gateways], self.traffic.models, self.traffic.headers)
        async with client_for(self.traffic.headers, httpx.Limits(max_connections=64)) as c:

            async def one(i: int) -> None:
                started = time.monotonic()
                url = traffic.gateways[i % len(traffic.gateways)]
                try:
                    kind, status, code, detail = await completion(traffic, c, url, random.Random(i))
                except httpx.TransportError as exc:
                    kind, status, code, detail = broken(exc)
                except httpx.HTTPError as exc:
                    kind, status, code, detail = SILENT, 0, None, repr(exc)[:200]
                outcome = Outcome("burst", kind, status, code, started, time.monotonic(), url, detail)
                self.traffic.outcomes.append(outcome)

            await asyncio.gather(*(one(i) for i in range(48)))
        refused = sum(1 for o in self.traffic.outcomes if o.api == "burst" and o.status == 429)
        return f"48 at once, {refused} answered 429 so far"


Fault = Callable[[Chaos], Awaitable[str]]
# In turn, in this order: a short run (`make test`'s five minutes on a loaded machine, where a
# node's restart alone takes two) gets the commonest faults first.
FAULTS: dict[str, Fault] = {
    "replica SIGKILL": Chaos.replica_sigkill,
    "controller killed": Chaos.controller_killed,
    "gateway restarted": Chaos.gateway_restarted,
    "rolling PUT update": Chaos.rolling_update,
    "reader stops reading": Chaos.reader_stops,
    "burst past the queue": Chaos.burst,
    "scale to 0 and back": Chaos.scale_to_zero_and_back,
    "node killed and back": Chaos.node_killed_and_back,
}


async def schedule(chaos: Chaos, seconds: float, every: float) -> None:
    """One fault every `every` seconds, the kinds in turn, until `seconds` have passed; each
    waits for the cluster to heal before the next may start."""
    end = time.monotonic() + seconds
    kinds = list(FAULTS.items())
    i = 0
    while time.monotonic() + every / 2 < end:
        await asyncio.sleep(every / 2)
        name, fault = kinds[i % len(kinds)]
        window = Window(name, time.monotonic())
        chaos.windows.append(window)
        try:
            window.note = await fault(chaos)
        except Exception as exc:  # the harness failed to inject: a finding too, reported
            window.note = f"injection failed: {exc!r}"[:300]
        await chaos.heal(window)
        i += 1
        await asyncio.sleep(max(0.0, every / 2 - (time.monotonic() - window.started)))
