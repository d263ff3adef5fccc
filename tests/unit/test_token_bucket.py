"""server/access/auth.py: the per-key token bucket, and the 429 it turns into."""

from __future__ import annotations

import math
import time
import types

import pytest

import raygate.server.access.auth
from raygate.protocol.errors import RateLimitError
from raygate.server.access.auth import KeyEntry, KeyStore, TokenBucket


class Clock:
    """A monotonic clock the test moves by hand. It starts an hour ahead of the real one: a bucket
    made with the default `stamp` (the real clock) has then refilled to capacity, which is where
    the keys' buckets start anyway."""

    def __init__(self) -> None:
        self.now = time.monotonic() + 3600

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Replace the clock `raygate.server.access.auth` reads (only there: the event loop keeps the real one)."""
    c = Clock()
    monkeypatch.setattr(raygate.server.access.auth, "time", types.SimpleNamespace(monotonic=c))
    return c


def test_burst_up_to_capacity_then_wait(clock: Clock) -> None:
    b = TokenBucket(rate=0.5, capacity=3, tokens=3, stamp=clock.now)
    assert [b.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take() == pytest.approx(2.0)  # one token at 0.5/s
    assert b.take() == pytest.approx(2.0)  # a refusal takes nothing


def test_refills_at_rate(clock: Clock) -> None:
    b = TokenBucket(rate=2.0, capacity=1, tokens=0, stamp=clock.now)
    assert b.take() == pytest.approx(0.5)
    clock.now += 0.25
    assert b.take() == pytest.approx(0.25)  # half a token in: half the wait left
    clock.now += 0.25
    assert b.take() == 0.0
    assert b.take() == pytest.approx(0.5)


def test_refill_is_capped_at_capacity(clock: Clock) -> None:
    b = TokenBucket(rate=1.0, capacity=2, tokens=0, stamp=clock.now)
    clock.now += 3600
    assert [b.take() for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]


def test_clock_standing_still_grants_nothing_extra(clock: Clock) -> None:
    b = TokenBucket(rate=100.0, capacity=1, tokens=1, stamp=clock.now)
    assert b.take() == 0.0
    assert b.take() == pytest.approx(0.01)


def test_key_rate_limit_is_a_429_with_whole_seconds(clock: Clock) -> None:
    store = KeyStore([KeyEntry(name="slow", key="sk-slow-0123456789", models=None, requests_per_minute=2)])
    header = ["Bearer sk-slow-0123456789"]
    store.authenticate(header)
    store.authenticate(header)  # a burst of rpm requests
    with pytest.raises(RateLimitError) as info:
        store.authenticate(header)
    assert info.value.status_code == 429
    assert info.value.retry_after == 30  # 2/min: one token every 30 s
    assert info.value.headers() == {"Retry-After": "30"}
    clock.now += 29.5
    with pytest.raises(RateLimitError) as info:
        store.authenticate(header)
    assert info.value.retry_after == math.ceil(0.5)
    clock.now += 0.5
    assert store.authenticate(header).name == "slow"


def test_fractional_rpm_still_allows_one_request(clock: Clock) -> None:
    store = KeyStore([KeyEntry(name="rare", key="sk-rare-0123456789", models=None, requests_per_minute=0.5)])
    store.authenticate(["Bearer sk-rare-0123456789"])
    with pytest.raises(RateLimitError) as info:
        store.authenticate(["Bearer sk-rare-0123456789"])
    assert info.value.retry_after == 120


def test_keys_without_a_limit_are_never_throttled(clock: Clock) -> None:
    store = KeyStore([KeyEntry(name="free", key="sk-free-0123456789", models=None, requests_per_minute=None)])
    for _ in range(1000):
        store.authenticate(["Bearer sk-free-0123456789"])
