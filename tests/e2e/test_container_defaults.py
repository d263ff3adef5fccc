"""What the container image relies on (Dockerfile: RAYGATE_CLOSED_ADMIN=1, keys from secret files):
`/admin` is refused without an admin key while `/v1` serves, and the admin key can come from a file
(a Docker secret). The image itself is built and run by `make test-image` (scripts/image_smoke.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from bench.servers import free_port
from tests.support.gateway import RAYGATE, REPO, start_gateway
from tests.support.release import release_namespace

SYNTH = "synth-container"
NAMESPACE = "raygate-container"
ADMIN_KEY = "container-admin-key-42"


def _config(folder: Path) -> Path:
    config = folder / "container.yaml"
    config.write_text(
        f"models:\n  - name: {SYNTH}\n    backend: synthetic\n    num_cpus: 0\n    engine: {{token_ms: 1, default_tokens: 4}}\n"
    )
    return config


def _no_raygate_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAYGATE_")}


@pytest.mark.slow
def test_closed_admin_refuses_admin_and_serves_v1(ray_address: str, tmp_path: Path) -> None:
    """`docker run raygate` with no keys: listens on every interface, /admin 403, /v1 answers."""
    key_file = tmp_path / "admin_key"
    key_file.write_text(f"{ADMIN_KEY}\n")  # a secret file ends with a newline: ignored
    common = ["--config", str(_config(tmp_path)), "--ray-address", ray_address, "--host", "0.0.0.0"]
    env = {**_no_raygate_env(), "RAYGATE_CLOSED_ADMIN": "1", "RAYGATE_RAY_NAMESPACE": NAMESPACE}
    gw = start_gateway(common, tmp_path / "closed.log", env=env)
    try:
        refused = httpx.get(f"{gw.url}/admin/deployments", timeout=30)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "admin_closed"
        chat = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": SYNTH, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert chat.status_code == 200, chat.text
        assert "/admin is closed" in gw.log() and "/v1 is open to anyone" in gw.log()
    finally:
        assert gw.stop() == 0, gw.log()[-4000:]

    gw = start_gateway(common, tmp_path / "keyed.log", env={**env, "RAYGATE_ADMIN_KEY_FILE": str(key_file)})
    try:
        assert httpx.get(f"{gw.url}/admin/deployments", timeout=30).status_code == 401
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        listed = httpx.get(f"{gw.url}/admin/deployments", headers=auth, timeout=30)
        assert listed.status_code == 200 and [d["name"] for d in listed.json()["data"]] == [SYNTH]
        assert ADMIN_KEY not in gw.log()
    finally:
        code = gw.stop()
        release_namespace(NAMESPACE)
    assert code == 0, gw.log()[-4000:]


def test_an_unreadable_admin_key_file_stops_the_start(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-secret"
    out = subprocess.run(
        [str(RAYGATE), "serve", "--port", str(free_port()), "--config", str(_config(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_no_raygate_env(), "RAYGATE_ADMIN_KEY_FILE": str(missing)},
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert str(missing) in out.stderr and "Traceback" not in out.stderr + out.stdout
