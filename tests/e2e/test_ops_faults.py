"""Faults made to happen for real: a client leaving mid-stream, a replica actor killed mid-stream, an
engine that fails after N tokens. Fault tests 1-3 of the operations issue; and Ray's own words for
an actor `ray.kill` ended, which the router's retry of a stopped replica reads."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import openai
import pytest
import ray

from raygate.backends.cluster.runtime.errors import stopped_by_controller
from tests.support.gateway import GatewayProcess
from tests.support.ops import ADMIN_KEY, StreamReader, metric, scrape, wait_for
from tests.support.replicas import replica_actors, replica_stats

TOKENS_PER_SECOND = 20  # synth-kill: token_ms 50


def _running_ids(model: str) -> list[str]:
    return [i for s in replica_stats(model) for i in s.running_ids]


def test_disconnect_stops_the_engine_within_a_second_of_tokens(admin: httpx.Client) -> None:
    """Observed on the engine: after the client leaves, the engine makes fewer tokens than it would
    in one second (20), and drops the request."""
    body = {"model": "synth-kill", "prompt": "x", "max_tokens": 2000, "stream": True}
    with admin.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": "leaver-1"}) as r:
        lines = r.iter_lines()
        events = 0
        while events < 5:
            events += next(lines).startswith("data: ")
        assert any(i.startswith("leaver-1/") for i in _running_ids("synth-kill"))
    at_close = sum(s.tokens_generated_total for s in replica_stats("synth-kill"))
    wait_for(
        lambda: not any(i.startswith("leaver-1/") for i in _running_ids("synth-kill")),
        10,
        0.02,
        "the engine to drop the request",
    )
    after = sum(s.tokens_generated_total for s in replica_stats("synth-kill"))
    assert after - at_close < TOKENS_PER_SECOND


def test_killed_replica_ends_its_streams_and_is_replaced(
    ops_gateway: GatewayProcess, admin: httpx.Client
) -> None:
    url = ops_gateway.url
    body = {"model": "synth-kill", "prompt": "x", "max_tokens": 120, "stream": True}  # 6 s each
    victim_stream, other_stream = StreamReader(url, body, "victim-1"), StreamReader(url, body, "bystander-1")
    for s in (victim_stream, other_stream):
        s.start()
        assert s.first.wait(30) and s.status == 200
    actors = replica_actors("synth-kill")
    assert len(actors) == 2
    stats = ray.get([a.stats.remote() for a in actors])
    victim = next(
        a
        for a, st in zip(actors, stats, strict=True)
        if any(i.startswith("victim-1/") for i in st.running_ids)
    )
    ray.kill(victim)

    victim_stream.join(30)
    assert not victim_stream.is_alive(), "the stream of the killed replica hung"
    assert victim_stream.error is None
    assert victim_stream.data[-1] == "[DONE]"
    assert json.loads(victim_stream.data[-2])["error"]["type"] == "service_unavailable"
    # New requests are served by the live replica (and by the replacement once it is up).
    for _ in range(4):
        r = admin.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2})
        assert r.status_code == 200, r.text
    other_stream.join(30)
    assert other_stream.data[-1] == "[DONE]"
    assert json.loads(other_stream.data[-2])["choices"][0]["finish_reason"] == "length"

    def replaced() -> bool:
        text = scrape(url)
        return (
            metric(text, "raygate:replicas_ready", model_name="synth-kill") == 2
            and metric(text, "raygate:replica_restarts_total", model_name="synth-kill") == 1
        )

    wait_for(replaced, 60, 0.5, "the replacement replica")
    new_actors = replica_actors("synth-kill")
    assert (
        len(new_actors) == 2 and sum(s.running for s in ray.get([a.stats.remote() for a in new_actors])) == 0
    )


def test_ready_says_which_model_lost_its_only_replica(ops_gateway: GatewayProcess) -> None:
    url = ops_gateway.url
    assert httpx.get(f"{url}/ready").status_code == 200
    (actor,) = replica_actors("synth-solo")
    ray.kill(actor)
    seen: list[httpx.Response] = []

    def not_ready() -> bool:
        r = httpx.get(f"{url}/ready", timeout=30)
        seen.append(r)
        return r.status_code == 503

    wait_for(not_ready, 15, 0.02, "/ready to report the dead replica")
    error = seen[-1].json()["error"]
    assert error["code"] == "not_ready" and "synth-solo" in error["message"]
    wait_for(lambda: httpx.get(f"{url}/ready", timeout=30).status_code == 200, 60, 0.5, "/ready again")
    assert metric(scrape(url), "raygate:replica_restarts_total", model_name="synth-solo") == 1
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "synth-solo", "prompt": "x", "max_tokens": 2},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert r.status_code == 200


def test_engine_failure_mid_stream_leaves_the_replica_usable(
    admin: httpx.Client, ops_gateway: GatewayProcess
) -> None:
    """synth-fail raises after its 3rd token."""
    body = {"model": "synth-fail", "prompt": "x", "max_tokens": 10, "stream": True}
    with admin.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "engine_error"
    assert [json.loads(d)["choices"][0]["text"] for d in data[:-2]] == [" tok"] * 3
    r = admin.post("/v1/completions", json={**body, "stream": False})
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
    with openai.OpenAI(base_url=f"{ops_gateway.url}/v1", api_key=ADMIN_KEY, max_retries=0) as c:
        with pytest.raises(openai.APIError, match="synthetic engine failure"):
            for _ in c.completions.create(model="synth-fail", prompt="x", max_tokens=10, stream=True):
                pass
        # Same replica (the only one), still serving.
        ok = c.completions.create(model="synth-fail", prompt="x", max_tokens=3)
        assert ok.choices[0].text == " tok" * 3 and ok.choices[0].finish_reason == "length"
    assert all(s.running == 0 for s in replica_stats("synth-fail"))


@ray.remote(num_cpus=0)
class _Pid:
    def pid(self) -> int:
        return os.getpid()


def _first_error(actor: ray.actor.ActorHandle) -> ray.exceptions.RayActorError:
    """`ray.kill` travels through the GCS while calls go straight to the actor, so a call made
    just after it may still run; the next ones fail once the kill lands."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            ray.get(actor.pid.remote(), timeout=120)
        except ray.exceptions.RayActorError as e:
            return e
        time.sleep(0.2)
    pytest.fail(f"{actor} still answers 120 s after it was ended")


def test_ray_says_an_actor_was_ended_by_ray_kill_and_not_when_it_crashed(ray_address: str) -> None:
    """The router sends a call that met a replica the controller stopped (drained, then
    `ray.kill`) to another replica, and fails one whose replica crashed: it tells them apart by
    Ray's own message (`stopped_by_controller`). This pins that message on the installed Ray, so
    an upgrade that rewords it fails here rather than turning those retries back into 503s."""
    killed, crashed = _Pid.remote(), _Pid.remote()  # type: ignore[attr-defined]
    ray.get(killed.pid.remote(), timeout=120)
    pid = ray.get(crashed.pid.remote(), timeout=120)
    ray.kill(killed)
    os.kill(pid, signal.SIGKILL)
    errors = [_first_error(killed), _first_error(crashed)]
    assert stopped_by_controller(errors[0]), errors[0]
    assert not stopped_by_controller(errors[1]), errors[1]
