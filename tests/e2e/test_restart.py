"""Persistence and the admin key, on a second gateway in its own Ray namespace (its own controller)
attached to the test session's Ray: what the operator deploys survives a restart of the gateway and
of the controller, and the persisted registry, not the config, decides what is served."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.admin import MINILM_PATH, SMOLLM, raygate, settled_ready, wait_deployment
from tests.support.gateway import RAYGATE, start_gateway
from tests.support.release import release_namespace

NAMESPACE = "raygate-restart-test"
ADMIN_KEY = "admin-s3cret"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
HI: list[Any] = [{"role": "user", "content": "hi"}]


def wait_ready(url: str, timeout: float = 120) -> None:
    """The gateway's own readiness: every model it serves has a ready replica."""
    deadline = time.monotonic() + timeout
    while (r := httpx.get(f"{url}/ready", timeout=30)).status_code != 200:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)


def kill_controller() -> None:
    """What losing the cluster's controller looks like; its replicas die with it (it owns them).
    A cluster restart loses the other detached actor of the namespace too, the Responses store."""
    release_namespace(NAMESPACE, timeout=60)


@pytest.fixture
def restart_env(ray_address: str, tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    state_dir = tmp_path / "state"
    args = ["--ray-address", ray_address, "--ray-namespace", NAMESPACE, "--state-dir", str(state_dir)]
    yield args, state_dir
    release_namespace(NAMESPACE)


def test_registry_survives_gateway_and_controller_restarts(
    restart_env: tuple[list[str], Path], tmp_path: Path
) -> None:
    args, state_dir = restart_env
    seed = tmp_path / "seed.yaml"
    seed.write_text(
        f"models:\n  - name: rs-embed\n    task: embed\n    num_cpus: 0.25\n    source: {{path: {MINILM_PATH}}}\n"
    )
    env = {**os.environ, "RAYGATE_ADMIN_KEY": ADMIN_KEY}

    gw = start_gateway(["--config", str(seed), "--admin-key", ADMIN_KEY, *args], tmp_path / "first.log")
    try:
        # The config seeded the registry file.
        saved = json.loads((state_dir / "registry.json").read_text())
        assert [d["name"] for d in saved["deployments"]] == ["rs-embed"]

        # /admin wants the admin key, with OpenAI's error shape; /v1 does not.
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_KEY}):
            r = httpx.get(f"{gw.url}/admin/deployments", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert httpx.get(f"{gw.url}/admin/deployments", headers=AUTH).status_code == 200
        assert httpx.get(f"{gw.url}/v1/models").status_code == 200
        denied = raygate("list", url=gw.url)
        assert denied.returncode == 1 and "401" in denied.stderr

        # An operator adds a chat model from a spec file (relative path made absolute by the CLI).
        spec = tmp_path / "chat.yaml"
        spec.write_text(
            f"name: rs-chat\naliases: [rs]\nsource: {{package: {SMOLLM['package']}, file: {SMOLLM['file']}}}\n"
            "num_cpus: 0.25\nengine: {n_ctx: 512}\n"
        )
        added = raygate("deploy", "--spec", str(spec), url=gw.url, env=env)
        assert added.returncode == 0, added.stderr
        wait_deployment(gw.url, "rs-chat", settled_ready(1), headers=AUTH)
        saved = json.loads((state_dir / "registry.json").read_text())
        assert [d["name"] for d in saved["deployments"]] == ["rs-embed", "rs-chat"]
        assert saved["deployments"][1]["aliases"] == ["rs"]
        assert not list(state_dir.glob(".registry.json.*")), "a temporary file was left behind"
    finally:
        assert gw.stop() == 0, gw.log()[-3000:]

    # Stopping a gateway attached to a cluster leaves the shared registry running; losing the
    # controller too (a cluster restart) leaves only the file.
    kill_controller()

    # A config that names another (even missing) model is ignored: the registry file wins.
    ignored = tmp_path / "ignored.yaml"
    ignored.write_text("models:\n  - name: not-served\n    source: {path: /nonexistent/model.gguf}\n")
    gw = start_gateway(["--config", str(ignored), "--admin-key", ADMIN_KEY, *args], tmp_path / "second.log")
    try:
        assert "registry restored from" in gw.log()
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            assert {m.id for m in client.models.list()} == {"rs-embed", "rs-chat", "rs"}
            assert (
                len(client.embeddings.create(model="rs-embed", input="back again").data[0].embedding) == 384
            )
            reply = client.chat.completions.create(model="rs", messages=HI, max_tokens=5)
            assert reply.choices[0].finish_reason in ("stop", "length")

            # The controller dies while the gateway runs: the gateway recreates it from the file,
            # whose models load again. Until the new controller says they are ready (the admin
            # API asks it, 503 while there is none, and the gateway's routes follow), requests
            # would get 503 "loading": wait for that, then for the gateway's own /ready.
            kill_controller()  # returns once the old controller and its replicas are gone
            for name in ("rs-embed", "rs-chat"):
                wait_deployment(gw.url, name, settled_ready(1), headers=AUTH)
            wait_ready(gw.url)
            assert {m.id for m in client.models.list()} == {"rs-embed", "rs-chat", "rs"}
            assert len(client.embeddings.create(model="rs-embed", input="and again").data) == 1
            reply = client.chat.completions.create(model="rs", messages=HI, max_tokens=5)
            assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        assert gw.stop() == 0, gw.log()[-3000:]


def test_unreadable_registry_stops_the_start_with_the_reason(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "registry.json").write_text("{ half a registry")
    r = subprocess.run(
        [str(RAYGATE), "serve", "--state-dir", str(state_dir), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2
    assert f"cannot read registry {state_dir / 'registry.json'}" in r.stderr and "delete it" in r.stderr
