"""The admin API on the shared gateway: listing, bad input, deploy -> serve -> scale 1->2->1 ->
undeploy with clients streaming throughout, updates, and dead replicas being replaced."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray

from tests.support.admin import (
    MINILM_PATH,
    OneStream,
    Streamer,
    chat_spec,
    deployments,
    embed_spec,
    settled_ready,
    wait_deployment,
)
from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.replicas import replica_actors, replica_stats


def assert_error(r: httpx.Response, status: int, *fragments: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in err["message"], err
    return err


def test_list_shows_every_replica_with_state_and_node(gateway: GatewayProcess) -> None:
    listed = deployments(gateway.url)
    chat = listed[CHAT_MODEL]
    assert chat["state"] == "ready" and chat["ready"] == chat["desired"] == 1
    assert chat["spec"]["aliases"] == ["smollm2"] and chat["spec"]["backend"] == "llama_cpp"
    assert [r["state"] for r in chat["replicas"]] == ["ready"]
    ray_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    for name in (CHAT_MODEL, EMBED_MODEL):
        for replica in listed[name]["replicas"]:
            assert replica["node_id"] in ray_nodes and replica["error"] is None


@pytest.mark.parametrize(
    ("spec", "fragments", "param"),
    [
        (chat_spec("bad-backend", backend="tensorflow"), ["backend", "llama_cpp"], "backend"),
        (
            embed_spec("bad-file", source={"path": "/nonexistent/x.gguf"}),
            ["Model file not found: /nonexistent/x.gguf"],
            "source",
        ),
        (embed_spec("bad-relative", source={"path": "models/x.gguf"}), ["must be absolute"], "source"),
        (embed_spec("bad-cpus", num_cpus=512), ["Impossible resources", "'CPU': 512.0"], "resources"),
        (embed_spec("bad-custom", resources={"tpu-v9": 1}), ["Impossible resources", "tpu-v9"], "resources"),
        (embed_spec(CHAT_MODEL), ["already exists"], "name"),
        (
            embed_spec("bad-alias", aliases=["smollm2"]),
            ["`smollm2` is already served by", CHAT_MODEL],
            "aliases",
        ),
        (embed_spec("bad-key", replica=2), ["replica"], "replica"),
        (embed_spec("bad-engine-key", engine={"n_ctxx": 512}), ["`n_ctxx`", "`n_ctx`"], "engine"),
        (
            embed_spec("bad-synthetic-key", backend="synthetic", engine={"tokn_ms": 1}),
            ["unknown synthetic engine option `tokn_ms`"],
            "engine",
        ),
        (embed_spec("bad-replicas", replicas=0), ["replicas"], "replicas"),
    ],
    ids=lambda v: v["name"] if isinstance(v, dict) else None,
)
def test_bad_deploy_is_400_and_leaves_registry_unchanged(
    gateway: GatewayProcess, spec: dict[str, Any], fragments: list[str], param: str
) -> None:
    before = deployments(gateway.url)
    err = assert_error(httpx.post(f"{gateway.url}/admin/deployments", json=spec, timeout=30), 400, *fragments)
    assert err["param"] == param
    after = deployments(gateway.url)
    assert {k: v["spec"] for k, v in after.items()} == {k: v["spec"] for k, v in before.items()}


def test_bad_scale_update_and_undeploy(gateway: GatewayProcess) -> None:
    url = gateway.url
    spec = deployments(url)[EMBED_MODEL]["spec"]
    assert_error(
        httpx.patch(f"{url}/admin/deployments/nope", json={"replicas": 2}), 404, "no deployment named `nope`"
    )
    assert_error(httpx.patch(f"{url}/admin/deployments/{EMBED_MODEL}", json={"replicas": 0}), 400, "replicas")
    assert_error(httpx.delete(f"{url}/admin/deployments/nope"), 404, "nope")
    renamed = embed_spec("other-name", source={"path": MINILM_PATH})
    assert_error(httpx.put(f"{url}/admin/deployments/{EMBED_MODEL}", json=renamed), 400, "renaming")
    assert deployments(url)[EMBED_MODEL]["spec"] == spec  # nothing refused changed it


# Four life-cycle steps with streams running throughout: ~5 min on two busy cores, past the default limit.
@pytest.mark.timeout(900)
def test_deploy_serve_scale_undeploy_with_streams_throughout(gateway: GatewayProcess) -> None:
    url, base_url, name = gateway.url, f"{gateway.url}/v1", "lc-api-chat"
    t0 = time.monotonic()
    r = httpx.post(f"{url}/admin/deployments", json=chat_spec(name, aliases=["lc-api"]), timeout=30)
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "loading" and r.json()["replicas"][0]["state"] == "loading"

    # Known but not loaded yet: 503 + Retry-After, not 404; and not listed as available.
    early = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": "lc-api", "messages": [{"role": "user", "content": "hi"}]},
    )
    err = assert_error(early, 503, "loading")
    assert err["code"] == "model_loading" and int(early.headers["retry-after"]) >= 1
    assert name not in {m["id"] for m in httpx.get(f"{base_url}/models").json()["data"]}

    wait_deployment(url, name, settled_ready(1))
    print(f"deploy of {name}: {time.monotonic() - t0:.1f}s to ready")
    assert {name, "lc-api"} <= {m["id"] for m in httpx.get(f"{base_url}/models").json()["data"]}

    with Streamer(base_url, "lc-api") as streams:
        streams.wait_for(3)
        t1 = time.monotonic()
        assert httpx.patch(f"{url}/admin/deployments/{name}", json={"replicas": 2}).status_code == 202
        wait_deployment(url, name, settled_ready(2))
        print(f"scale 1->2: {time.monotonic() - t1:.1f}s")
        before = replica_stats(name)
        streams.wait_for(8)
        served = [
            a.requests_total - b.requests_total for a, b in zip(replica_stats(name), before, strict=True)
        ]
        assert len(served) == 2 and min(served) >= 1, served  # the new replica takes traffic

        t2 = time.monotonic()
        r = httpx.patch(f"{url}/admin/deployments/{name}", json={"replicas": 1})
        assert r.status_code == 202 and "draining" in [x["state"] for x in r.json()["replicas"]]
        wait_deployment(url, name, settled_ready(1))
        print(f"scale 2->1 (drained): {time.monotonic() - t2:.1f}s")
        streams.wait_for(3)
    assert not streams.failures, streams.failures
    assert len(replica_actors(name)) == 1

    # Undeploy while a stream runs: it finishes (drained) before the replica goes away.
    with OneStream(base_url, name, max_tokens=120) as inflight:
        inflight.first_token.wait(60)
        r = httpx.delete(f"{url}/admin/deployments/{name}", params={"timeout": 60}, timeout=90)
        undeployed_at = time.monotonic()
    assert r.status_code == 200 and r.json()["drained"] is True, r.text
    assert inflight.error is None and inflight.finish in ("stop", "length"), inflight.error
    assert inflight.ended_at is not None and inflight.ended_at <= undeployed_at
    hi = [{"role": "user", "content": "hi"}]
    assert_error(httpx.post(f"{base_url}/chat/completions", json={"model": name, "messages": hi}), 404)
    assert name not in deployments(url) and not replica_actors(name)


def test_update_rolls_to_a_new_spec_and_a_broken_one_keeps_the_old(
    gateway: GatewayProcess, client: openai.OpenAI, tmp_path: Path
) -> None:
    url, name = gateway.url, "lc-update"
    assert httpx.post(f"{url}/admin/deployments", json=embed_spec(name)).status_code == 202
    first = wait_deployment(url, name, settled_ready(1))

    # Aliases only: applied in place, same replica.
    r = httpx.put(f"{url}/admin/deployments/{name}", json=embed_spec(name, aliases=["lc-upd"]))
    assert r.status_code == 202
    assert r.json()["replicas"][0]["id"] == first["replicas"][0]["id"]
    status = wait_deployment(url, name, lambda s: settled_ready(1)(s) and s["spec"]["aliases"] == ["lc-upd"])
    assert status["replicas"][0]["id"] == first["replicas"][0]["id"]
    assert len(client.embeddings.create(model="lc-upd", input="x").data[0].embedding) == 384

    # Engine change: a new replica loads, then the old one drains.
    new_engine = {"n_ctx": 256, "n_batch": 256, "n_ubatch": 256}
    r = httpx.put(
        f"{url}/admin/deployments/{name}", json=embed_spec(name, aliases=["lc-upd"], engine=new_engine)
    )
    assert r.status_code == 202 and r.json()["updating"] is True
    busy = httpx.patch(f"{url}/admin/deployments/{name}", json={"replicas": 2})
    assert assert_error(busy, 409, "being updated")["code"] == "conflict"
    status = wait_deployment(url, name, settled_ready(1))
    assert status["spec"]["engine"]["n_ctx"] == 256
    assert status["replicas"][0]["id"] != first["replicas"][0]["id"]

    # Weights that exist but do not load: the update fails, the old replica keeps serving.
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"this is not a GGUF file" * 100)
    broken = embed_spec(name, aliases=["lc-upd"], engine=new_engine, source={"path": str(corrupt)})
    assert httpx.put(f"{url}/admin/deployments/{name}", json=broken).status_code == 202
    status = wait_deployment(url, name, lambda s: not s["updating"] and s["error"] is not None)
    assert "update failed" in status["error"] and "could not load" in status["error"]
    assert status["state"] == "ready" and status["spec"]["engine"]["n_ctx"] == 256
    assert len(client.embeddings.create(model=name, input="still here").data) == 1
    assert httpx.delete(f"{url}/admin/deployments/{name}").status_code == 200


def test_dead_replica_is_replaced_then_reported_failed(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    url, name = gateway.url, "lc-crash"
    assert httpx.post(f"{url}/admin/deployments", json=embed_spec(name, max_restarts=1)).status_code == 202
    wait_deployment(url, name, settled_ready(1))

    ray.kill(replica_actors(name)[0])
    status = wait_deployment(url, name, lambda s: s["restarts"] == 1 and settled_ready(1)(s))
    assert "died" in status["error"] and "replaced (1/1" in status["error"]
    assert len(client.embeddings.create(model=name, input="back").data) == 1

    ray.kill(replica_actors(name)[0])
    status = wait_deployment(url, name, lambda s: s["state"] == "failed")
    replica = status["replicas"][0]
    assert replica["state"] == "failed" and "max_restarts=1 reached" in replica["error"]
    assert "died" in status["error"]
    r = httpx.post(f"{url}/v1/embeddings", json={"model": name, "input": "x"})
    assert_error(r, 503, "no ready replica", "max_restarts=1")
    assert name not in {m.id for m in client.models.list()}

    # Scaling a failed deployment starts over with a fresh restart budget.
    assert httpx.patch(f"{url}/admin/deployments/{name}", json={"replicas": 1}).status_code == 202
    status = wait_deployment(url, name, settled_ready(1))
    assert status["restarts"] == 0
    assert httpx.delete(f"{url}/admin/deployments/{name}").status_code == 200
