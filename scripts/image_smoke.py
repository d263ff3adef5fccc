"""`make test-image`: build the image, then check it and the compose cluster as a user would.

1. `docker build` (timed): cold on a fresh machine, seconds when only a README or source changed.
2. `docker run` the image: ready, non-root, /dev/shm big enough for Ray's object store (no warning),
   models / chat / stream / embeddings through the openai SDK, /admin refused without a key;
   `docker stop` during a long stream: the stream finishes (drained) and the container exits 0.
3. `docker-compose up`: the two-node cluster; scale a deployment (a registry change), then restart
   the gateway container, the head container, and `down` / `up` (volume kept): after each, the
   registry and its replicas are back and, once /ready says ready, no request gets a 5xx.

Prints one line per step with its time; any failure raises with the container logs. Everything it
starts is removed at the end (`down -v`, `rm -f`), the image stays (the layer cache).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

REPO = Path(__file__).resolve().parent.parent
IMAGE = "raygate:latest"  # the name docker-compose.yml runs
NAME = "raygate-smoke"
PROJECT = "raygate-smoke"
ADMIN_KEY = "smoke-admin-key-0123"
CHAT, EMBED = "smollm2", "all-minilm-l6-v2"
READY_S = 300.0
SHM_WARNING = "/dev/shm"  # Ray's "object store is using /tmp instead of /dev/shm" warning


def sh(*args: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    out = subprocess.run(
        args,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    if check and out.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return out.stdout + out.stderr


def step(what: str, t0: float) -> None:
    print(f"[image] {what}: {time.monotonic() - t0:.1f} s", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = READY_S) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return time.monotonic() - t0
        time.sleep(0.5)
    raise RuntimeError(f"{url}/ready did not answer 200 within {timeout:.0f} s")


def check_serving(url: str, api: OpenAI) -> None:
    """models, chat, stream, embeddings: each answers, and answers like the OpenAI API."""
    ids = {m.id for m in api.models.list().data}
    assert {CHAT, EMBED} <= ids, ids
    chat = api.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
    )
    assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens > 0
    chunks = list(
        api.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Count."}], max_tokens=8, stream=True
        )
    )
    assert any(c.choices and c.choices[0].delta.content for c in chunks), chunks
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason is not None
    vectors = api.embeddings.create(model=EMBED, input=["a cat", "a dog"]).data
    assert len(vectors) == 2 and len(vectors[0].embedding) == 384


def hammer(url: str, api: OpenAI, n: int = 12) -> None:
    """Requests right after /ready: every one answers 200 (none 5xx)."""
    for i in range(n):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": CHAT, "messages": [{"role": "user", "content": f"#{i}"}], "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200, (r.status_code, r.text)
    check_serving(url, api)


# ---- the image on its own ----------------------------------------------------------------------


def build() -> None:
    t0 = time.monotonic()
    if os.environ.get("RAYGATE_IMAGE_PREBUILT"):  # test an image built elsewhere, as it is
        sh("docker", "image", "inspect", IMAGE)
    else:
        sh("docker", "build", "-t", IMAGE, ".")
        step("docker build", t0)
    size = sh("docker", "image", "inspect", IMAGE, "--format", "{{.Size}}").strip()
    print(f"[image] size: {int(size) / 1e6:.0f} MB", flush=True)


@contextlib.contextmanager
def container() -> Iterator[str]:
    port = free_port()
    sh("docker", "rm", "-f", NAME, check=False)
    t0 = time.monotonic()
    sh("docker", "run", "-d", "--name", NAME, "--shm-size=512m", "-p", f"127.0.0.1:{port}:8000", IMAGE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        step("docker run -> /ready", t0)
        yield url
    except BaseException:
        print(sh("docker", "logs", NAME, check=False)[-6000:], file=sys.stderr)
        raise
    finally:
        sh("docker", "rm", "-f", NAME, check=False)


def check_container(url: str) -> None:
    api = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    check_serving(url, api)
    assert sh("docker", "exec", NAME, "id", "-u").strip() != "0", "the gateway runs as root"
    admin = httpx.get(f"{url}/admin/deployments", timeout=10)
    assert admin.status_code == 403, (admin.status_code, admin.text)
    logs = sh("docker", "logs", NAME)
    assert SHM_WARNING not in logs, "Ray warned about /dev/shm:\n" + logs[-3000:]
    assert "/v1 is open" in logs  # the existing warning, since no API keys are set

    # docker stop during a long stream: the stream ends normally, the container exits 0.
    stream = api.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=600,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    stopper: list[str] = []
    finish: list[Any] = []
    for chunk in stream:
        if not stopper:
            stopper.append("started")
            threading.Thread(target=lambda: stopper.append(sh("docker", "stop", "-t", "45", NAME))).start()
        if chunk.choices and chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
    assert finish == ["length"], finish
    for _ in range(120):
        if len(stopper) == 2:
            break
        time.sleep(0.5)
    code = sh("docker", "inspect", NAME, "--format", "{{.State.ExitCode}}").strip()
    assert code == "0", f"exit code {code}"
    print("[image] docker stop during a stream: drained, exit 0", flush=True)


# ---- compose ----------------------------------------------------------------------------------


def compose(*args: str, env: dict[str, str]) -> str:
    return sh("docker-compose", "-p", PROJECT, *args, env=env)


def registry(url: str, timeout: float = 120) -> dict[str, int | str]:
    """Deployment name -> desired replicas (an autoscaled one: its `min-max` range, what the
    registry remembers of it), once every deployment has them all ready."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(
            f"{url}/admin/deployments", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
        )
        assert r.status_code == 200, (r.status_code, r.text)
        items = r.json()["data"]
        if (
            all(d["ready"] == d["desired"] == len(d["replicas"]) for d in items)
            or time.monotonic() > deadline
        ):
            return {d["name"]: _remembered(d) if d["ready"] == d["desired"] else -1 for d in items}
        time.sleep(0.5)


def _remembered(deployment: dict[str, Any]) -> int | str:
    scaling = deployment["spec"].get("autoscaling")
    return f"{scaling['min_replicas']}-{scaling['max_replicas']}" if scaling else int(deployment["desired"])


def started_at(service: str) -> str:
    """When this compose project's container of `service` last started."""
    labels = (f"label=com.docker.compose.project={PROJECT}", f"label=com.docker.compose.service={service}")
    ids = sh("docker", "ps", "-aq", "--filter", labels[0], "--filter", labels[1]).split()
    assert len(ids) == 1, f"{service}: containers {ids}"
    return sh("docker", "inspect", ids[0], "--format", "{{.State.StartedAt}}").strip()


def wait_restarted(service: str, before: str, timeout: float = READY_S) -> None:
    """A head restart takes the gateway's Ray node with it: the gateway must exit and come back by
    its restart policy (ARCHITECTURE.md). Until it has, its /ready may still describe the old
    cluster for a moment, so readiness is only asked of the new process."""
    deadline = time.monotonic() + timeout
    while started_at(service) == before:
        assert time.monotonic() < deadline, f"{service} did not restart within {timeout:.0f} s"
        time.sleep(1)


def check_compose() -> None:
    port = free_port()
    env = {"RAYGATE_PORT": str(port), "RAYGATE_ADMIN_KEY": ADMIN_KEY}
    url = f"http://127.0.0.1:{port}"
    api = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    compose("down", "-v", env=env)
    try:
        t0 = time.monotonic()
        compose("up", "-d", env=env)
        wait_ready(url)
        step("compose up -> /ready", t0)
        check_serving(url, api)
        # A registry change that only the state volume remembers (the config says 1 replica); the
        # embedding model loads on demand (0-1 replicas).
        r = httpx.patch(
            f"{url}/admin/deployments/smollm2-135m-instruct",
            json={"replicas": 2},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=120,
        )
        assert r.status_code == 202, (r.status_code, r.text)
        expected = registry(url)
        assert expected == {"smollm2-135m-instruct": 2, "all-minilm-l6-v2": "0-1"}, expected
        print(f"[image] registry: {expected}", flush=True)
        for what, args in (
            ("restart gateway", ("restart", "gateway")),
            ("restart ray-head", ("restart", "ray-head")),
        ):
            t0 = time.monotonic()
            gateway_started = started_at("gateway")
            compose(*args, env=env)
            wait_restarted("gateway", gateway_started)
            wait_ready(url)
            step(f"compose {what} -> /ready", t0)
            hammer(url, api)
            assert registry(url) == expected, (registry(url), expected)
        t0 = time.monotonic()
        compose("down", env=env)
        compose("up", "-d", env=env)
        wait_ready(url)
        step("compose down; up -> /ready", t0)
        hammer(url, api)
        assert registry(url) == expected, (registry(url), expected)
    except BaseException:
        print(sh("docker-compose", "-p", PROJECT, "logs", check=False, env=env)[-8000:], file=sys.stderr)
        raise
    finally:
        compose("down", "-v", env=env)


def main() -> None:
    t0 = time.monotonic()
    build()
    with container() as url:
        check_container(url)
    check_compose()
    step("make test-image passed", t0)


if __name__ == "__main__":
    main()
