"""The ledger without Ray: the database (SQLite file; tests/e2e/test_ledger.py runs it on
PostgreSQL through gateways), the actor's budget checks and key versions, the gateway's key store
fed from it, the 429 a spent budget becomes, the bounded per-key metric labels and the writer's
buffer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime as dt
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from raygate.backends.cluster.stores.ledger import Ledger
from raygate.backends.cluster.stores.ledger_db import DB_FILE, LedgerDB, database_problem
from raygate.backends.cluster.stores.ledger_records import UsageRecord, windows
from raygate.protocol.errors import AuthenticationError, QuotaExceededError, RateLimitError
from raygate.protocol.ledger import KeyBudget, KeyCreate
from raygate.server.access.auth import KeyStore
from raygate.server.access.budgets import refusal_error
from raygate.server.observability.ledger_writer import LedgerWriter
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.observability.usage_metrics import OTHER, KeyLabels, count_usage

NOON = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC).timestamp()
DAY = 24 * 3600.0


def record(
    key: str, at: float, prompt: int, completion: int, model: str = "m", cached: int = 0
) -> UsageRecord:
    return UsageRecord(at, key, model, "chat.completions", "req", prompt, completion, cached)


def bearer(secret: str) -> list[str]:
    return [f"Bearer {secret}"]


def test_usage_groups_filters_and_survives_a_reopen(tmp_path: Path) -> None:
    db = LedgerDB(None, tmp_path)
    db.record(
        [
            record("a", NOON, 10, 5, cached=4),
            record("a", NOON + 60, 7, 3, model="n"),
            record("b", NOON, 1, 1),
            record("a", NOON + DAY, 2, 2),
        ]
    )
    rows = db.report(("key", "model", "day"))
    assert [(r.key_id, r.model, r.day, r.prompt_tokens, r.completion_tokens) for r in rows] == [
        ("a", "m", "2026-11-27", 10, 5),
        ("a", "m", "2026-11-28", 2, 2),
        ("a", "n", "2026-11-27", 7, 3),
        ("b", "m", "2026-11-27", 1, 1),
    ]
    (only_a,) = db.report(("key",), key_id="a", since=NOON, until=NOON + DAY)
    assert (only_a.requests, only_a.prompt_tokens, only_a.cached_tokens, only_a.total_tokens) == (
        2,
        17,
        4,
        25,
    )
    assert db.report(("model",), model="nothing") == []
    db.close()

    reopened = LedgerDB(None, tmp_path)  # a restarted ledger: the migrations find the schema at head
    assert sum(r.total_tokens for r in reopened.report(())) == 15 + 10 + 2 + 4
    reopened.close()


def test_spent_counts_the_utc_day_and_month() -> None:
    db = LedgerDB(None, None)
    db.record([record("a", NOON - DAY, 100, 0), record("a", NOON, 10, 5), record("b", NOON, 1000, 0)])
    spent = db.spent("a", NOON + 60)
    assert (spent.day, spent.month) == (15, 115)
    assert spent.day_resets_at == dt.datetime(2026, 11, 28, tzinfo=dt.UTC).timestamp()
    assert spent.month_resets_at == dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()


def test_windows_roll_over_the_year() -> None:
    new_years_eve = dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC).timestamp()
    _, month, next_day, next_month = windows(new_years_eve)
    assert month == dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
    assert next_day == next_month == dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()


def test_keys_are_stored_as_digests_rotated_revoked_and_expire(tmp_path: Path) -> None:
    db = LedgerDB(None, tmp_path)
    made = db.create_key(KeyCreate(name="team", models=["m"], budget=KeyBudget(tokens_per_day=10)))
    assert made.key.startswith("sk-rg-") and made.state == "active"
    raw = sqlite3.connect(tmp_path / DB_FILE).execute("SELECT * FROM api_keys").fetchall()
    assert made.key not in repr(raw)  # the secret is nowhere in the database

    rotated = db.rotate_key(made.id)
    assert rotated.id == made.id and rotated.key != made.key and rotated.rotated_at is not None
    (active,) = db.active_keys()
    assert active.models == ("m",) and active.budget.tokens_per_day == 10

    soon = db.create_key(KeyCreate(name="brief", expires_in_s=60), now=NOON)
    assert soon.expires_at == NOON + 60
    assert {k.id for k in db.active_keys(now=NOON + 61)} == {made.id}
    assert db.get_key(soon.id, now=NOON + 61).state == "expired"

    assert db.revoke_key(made.id).state == "revoked"
    assert made.id not in {k.id for k in db.active_keys()}
    assert {k.id for k in db.list_keys()} == {made.id, soon.id}  # kept, so usage still names them


def test_a_database_url_that_cannot_work_is_explained() -> None:
    assert database_problem("sqlite://") is None
    assert "cannot use --database-url" in str(database_problem("nosuchdb://x"))
    refused = database_problem("postgresql://someone:secret@127.0.0.1:1/raygate")
    assert refused is not None and "cannot connect to" in refused and "secret" not in refused


def test_the_ledger_admits_until_the_budget_is_spent() -> None:
    ledger = Ledger(None, None)
    budget = KeyBudget(tokens_per_day=20, tokens_per_month=100)
    assert ledger.admit("a", budget, NOON) is None
    ledger.record([record("a", NOON, 12, 8)])
    refusal = ledger.admit("a", budget, NOON + 1)
    assert refusal is not None and refusal.reason == "quota"
    assert refusal.resets_at == dt.datetime(2026, 11, 28, tzinfo=dt.UTC).timestamp()
    assert ledger.admit("a", budget, NOON + DAY) is None  # a new day
    assert ledger.admit("b", budget, NOON) is None  # another key's budget is its own

    ledger.record([record("a", NOON - 5 * DAY, 90, 0)])
    monthly = ledger.admit("a", budget, NOON + DAY)
    assert monthly is not None and monthly.resets_at == dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()


def test_the_ledger_counts_parallel_requests() -> None:
    ledger = Ledger(None, None)
    two = KeyBudget(max_parallel=2)
    assert ledger.admit("a", two) is None
    assert ledger.admit("a", two) is None
    refusal = ledger.admit("a", two)
    assert refusal is not None and refusal.reason == "parallel"
    ledger.release("a")
    assert ledger.admit("a", two) is None


def test_key_changes_bump_the_version_gateways_poll() -> None:
    ledger = Ledger(None, None)
    version, keys = ledger.keys(None)
    assert keys == []
    assert ledger.keys(version) == (version, None)  # nothing changed: no list sent
    made = ledger.create_key(KeyCreate(name="x"))
    newer, keys = ledger.keys(version)
    assert newer != version and keys is not None and [k.id for k in keys] == [made.id]
    assert ledger.revoke_key("key_unknown") is None
    assert ledger.revoke_key(made.id) is not None
    assert ledger.keys(newer)[1] == []


def test_a_gateways_wait_for_the_keys_ends_when_they_change_or_at_its_timeout() -> None:
    ledger = Ledger(None, None)
    version = ledger.keys(None)[0]
    assert ledger.wait_keys(None, 5.0) == version  # the caller's version is old: at once
    assert ledger.wait_keys(version, 0.05) == version  # nothing changed: the timeout
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the stores actor's watch thread
        waiting = pool.submit(ledger.wait_keys, version, 30.0)
        time.sleep(0.1)
        assert not waiting.done()
        ledger.create_key(KeyCreate(name="x"))  # on the ledger's own thread
        newer = waiting.result(timeout=5)
    assert newer != version and newer == ledger.keys(None)[0]


def test_the_key_store_follows_the_ledger() -> None:
    db = LedgerDB(None, None)
    store = KeyStore([])
    assert not store.enabled
    made = db.create_key(KeyCreate(name="team", models=["m"], budget=KeyBudget(max_parallel=1)))
    store.set_stored(db.active_keys())
    assert store.enabled  # a key in the database turns keys on
    key = store.authenticate(bearer(made.key))
    assert (key.id, key.name, key.models, key.budget) == (made.id, "team", frozenset({"m"}), made.budget)
    with pytest.raises(AuthenticationError):
        store.authenticate(bearer("sk-rg-wrong-secret-000"))

    rotated = db.rotate_key(made.id)
    store.set_stored(db.active_keys())
    assert store.authenticate(bearer(rotated.key)).id == made.id
    with pytest.raises(AuthenticationError):
        store.authenticate(bearer(made.key))

    db.revoke_key(made.id)
    store.set_stored(db.active_keys())
    assert not store.enabled


def test_an_expired_key_is_refused_by_the_gateway() -> None:
    db = LedgerDB(None, None)
    made = db.create_key(KeyCreate(name="brief", expires_in_s=3600), now=NOON)
    store = KeyStore([])
    store.set_stored(db.active_keys(now=NOON))
    with pytest.raises(AuthenticationError, match="expired"):  # its hour is long over
        store.authenticate(bearer(made.key))


def test_a_spent_budget_is_openais_insufficient_quota() -> None:
    ledger = Ledger(None, None)
    ledger.record([record("a", NOON, 5, 5)])
    refusal = ledger.admit("a", KeyBudget(tokens_per_day=10), NOON)
    assert refusal is not None
    error = refusal_error(_Named("team"), refusal, NOON)  # type: ignore[arg-type]
    assert isinstance(error, QuotaExceededError)
    assert (error.status_code, error.error_type, error.code) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
    )
    assert error.retry_after == 12 * 3600 and "2026-11-28T00:00:00Z" in error.message
    parallel = ledger.admit("b", KeyBudget(max_parallel=1)) or ledger.admit("b", KeyBudget(max_parallel=1))
    assert parallel is not None
    busy = refusal_error(_Named("team"), parallel, NOON)  # type: ignore[arg-type]
    assert type(busy) is RateLimitError and busy.error_type == "requests"


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_metric_labels_are_bounded() -> None:
    labels = KeyLabels(2)
    assert [labels.label(k) for k in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]


def test_metrics_name_a_bounded_number_of_keys_and_lose_no_tokens() -> None:
    """A thousand keys through `/metrics`' own rendering: per counter and model, at most the
    configured number of key ids plus `other`, and the sums are every key's tokens."""
    metrics, labels = GatewayMetrics(), KeyLabels(5)
    keys = [f"key_{i}" for i in range(1000)]
    for i, key in enumerate(keys):
        count_usage(metrics, labels, record(key, NOON, prompt=i % 7 + 1, completion=3, model=f"m{i % 2}"))
    body, _ = metrics.render([])
    samples = [
        line for line in body.decode().splitlines() if line.startswith("raygate:key_prompt_tokens_total{")
    ]
    named = {line.split('key_id="')[1].split('"')[0] for line in samples}
    assert len(named) == 6 and OTHER in named  # the first five seen, and everyone else
    assert len(samples) <= 6 * 2  # (named + other) x models, whatever the number of keys
    assert sum(float(line.rsplit(" ", 1)[1]) for line in samples) == sum(i % 7 + 1 for i in range(1000))


async def test_the_writer_batches_retries_and_loses_nothing_on_close() -> None:
    sent: list[tuple[str, list[Any]]] = []
    failing = [True]

    async def send(method: str, batch: list[Any]) -> None:
        if failing[0]:
            raise ConnectionError("ledger restarting")
        sent.append((method, batch))

    writer = LedgerWriter(send, max_buffered=3)
    for i in range(4):
        writer.usage(record("a", NOON, i, 0))
    writer.audit({"action": "deploy"})
    assert writer.pending == 4  # the oldest usage record went past the bound
    with pytest.raises(ConnectionError):
        await writer.flush()
    assert writer.pending == 4  # a failed batch stays buffered
    failing[0] = False
    await writer.close()
    assert writer.pending == 0
    assert sent[0] == ("append_audit", [{"action": "deploy"}])
    assert [r.prompt_tokens for r in sent[1][1]] == [1, 2, 3]


async def test_the_writer_task_writes_an_urgent_record_at_once() -> None:
    got = asyncio.Event()

    async def send(method: str, batch: list[Any]) -> None:
        got.set()

    writer = LedgerWriter(send)
    task = asyncio.create_task(writer.run())
    writer.usage(record("a", NOON, 1, 1), urgent=True)
    await asyncio.wait_for(got.wait(), 30)
    task.cancel()


def test_running_requests_hold_their_most_and_give_it_back_with_their_usage() -> None:
    ledger = Ledger(None, None)
    budget = KeyBudget(tokens_per_day=100)
    assert ledger.reserve("a", budget, 60, NOON) is None
    assert ledger.reserve("a", budget, 60, NOON) is None  # 60 held < 100: one more may start
    held = ledger.reserve("a", budget, 60, NOON)
    assert held is not None and held.reason == "quota" and "running requests hold" in held.message
    assert held.resets_at == NOON + 1  # not spent: worth a retry when they end
    assert ledger.admit("a", budget, NOON) is not None  # the middleware's check sees it too
    ledger.record([dataclasses.replace(record("a", NOON, 10, 20), reserved=60)])  # 30 spent, 60 held
    assert ledger.reserve("a", budget, 60, NOON) is None
    assert ledger.reserve("b", budget, 60, NOON) is None  # another key's budget is its own
    assert ledger.reserve("a", KeyBudget(max_parallel=1), 60, NOON) is None  # no token budget: nothing held
    ledger.unreserve("a", 60)  # a request that reached no engine
    ledger.unreserve("a", 60)
    assert ledger.reserve("a", budget, 60, NOON) is None


def test_concurrent_requests_overshoot_a_budget_by_at_most_one_request() -> None:
    """Requests of one key from many gateways, interleaved: each reserves its most (the
    context), uses a random part of it, and records it later, while others start. Whatever the
    order, the spent tokens pass the budget by less than one request's use."""
    rng = random.Random(50)
    context, limit = 64, 300
    for _ in range(5):
        ledger = Ledger(None, None)
        budget = KeyBudget(tokens_per_day=limit)
        running: list[int] = []
        biggest = 0
        for _ in range(60):
            if running and rng.random() < 0.5:
                ledger.record(
                    [
                        dataclasses.replace(
                            record("k", NOON, 0, running.pop(rng.randrange(len(running)))), reserved=context
                        )
                    ]
                )
            elif ledger.reserve("k", budget, context, NOON) is None:
                use = rng.randint(1, context)
                biggest = max(biggest, use)
                running.append(use)
        while running:
            ledger.record([dataclasses.replace(record("k", NOON, 0, running.pop()), reserved=context)])
        assert ledger._db.spent("k", NOON).day < limit + biggest
