"""The EngineCore process dies mid-stream (a real SIGKILL): the stream ends with a clean in-band
error, new requests are refused with an OpenAI error while the replica builds a new engine, and
then the model serves again. Last in this folder by name: it costs an engine restart."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import psutil
import pytest
import ray

from tests.support.models import CHAT_MODEL
from tests.support.vllm import VllmDeployment, replica_pid

RESTART_TIMEOUT_S = 600


def engine_core(vllm: VllmDeployment) -> psutil.Process:
    replica = psutil.Process(replica_pid(vllm.replica(CHAT_MODEL)))
    cores = [p for p in replica.children() if "EngineCore" in " ".join(p.cmdline())]
    assert len(cores) == 1, replica.children()
    return cores[0]


@pytest.mark.timeout(RESTART_TIMEOUT_S + 120)
def test_engine_death_fails_in_flight_then_the_replica_serves_again(
    base_url: str, vllm: VllmDeployment
) -> None:
    core = engine_core(vllm)
    # The replica's greedy answer before the crash; the new engine must give the same one (the
    # same kernels on the same CPU: another CPU may answer otherwise, but the same before and after).
    probe = {"model": CHAT_MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}
    before = httpx.post(f"{base_url}/completions", json=probe, timeout=120)
    assert before.status_code == 200, before.text
    # Only the engine's death may end this stream: a greedy stop at the model's EOS (where it comes
    # moves with the CPU) before the kill took effect would leave no error to see.
    body = {
        "model": CHAT_MODEL,
        "prompt": "1, 2, 3,",
        "max_tokens": 1500,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    events: list[dict] = []
    with httpx.stream("POST", f"{base_url}/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                events.append({"done": True})
                break
            events.append(json.loads(line[len("data: ") :]))
            if len(events) == 3:
                os.kill(core.pid, signal.SIGKILL)
    assert events[-1] == {"done": True}, events[-3:]
    error = events[-2]["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_dead", error
    assert len(events) < 1500

    # While the replica builds a new engine, requests get an OpenAI error, never a hang.
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    statuses: set[int] = set()
    while True:
        r = httpx.post(f"{base_url}/completions", json=probe, timeout=120)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        statuses.add(r.status_code)
        time.sleep(2)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
    assert statuses <= {500, 503} and 503 in statuses, statuses
    assert engine_core(vllm).pid != core.pid
    s = ray.get(vllm.replica(CHAT_MODEL).stats.remote())
    assert s.engine_restarts == 1 and s.running == 0
