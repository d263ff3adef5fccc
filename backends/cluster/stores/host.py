"""The namespace's three stores in one Ray actor: stored responses (`responses.py`), files and
batches (`batches.py`), and the ledger (`ledger.py`).

Why one: each Ray actor is a Python process of its own that imports Ray (~90-100 MB of RSS idle,
measured by bench/footprint.py), and the three stores hold a few SQLite connections between
them. Why they stay apart inside it: each store is a concurrency group of one thread, so a store
still runs one call at a time on one connection (what each was written for), and a slow call to
one (a batch's whole output file, a usage report) never waits behind or holds up another.

Like the controller the actor is named, detached, found by every gateway of the namespace, placed
where the controller goes (`placement.state_actor_options`), and restarted by Ray when it dies:
it reopens its files. The first gateway's settings decide where the data lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from raygate.backends.cluster.runtime.placement import state_actor_options
from raygate.backends.cluster.stores.batches import BatchStore
from raygate.backends.cluster.stores.ledger import Ledger
from raygate.backends.cluster.stores.responses import ResponseStore

STORES_NAME = "stores"
PARTS = ("responses", "batches", "ledger")
# Gateways waiting for the ledger's keys to change (`Ledger.wait_keys`), each on a thread of its
# own while it waits; a gateway beyond these waits for a thread, at most one wait's timeout.
KEY_WATCHERS = 64


@dataclass(frozen=True)
class StoreSettings:
    """What the stores are opened with (the first gateway's `raygate serve` settings)."""

    state_dir: Path | None
    responses_max_age_s: float
    responses_max_bytes: int
    batch_window_s: float
    database_url: str | None


class StoreHost:
    """The actor: one method per store, each in its store's concurrency group, calling the named
    method of that store."""

    def __init__(self, settings: StoreSettings) -> None:
        state_dir = str(settings.state_dir) if settings.state_dir else None
        self._responses = ResponseStore(state_dir, settings.responses_max_age_s, settings.responses_max_bytes)
        self._batches = BatchStore(state_dir, settings.batch_window_s)
        self._ledger = Ledger(settings.database_url, state_dir)

    @ray.method(concurrency_group="responses")
    def responses(self, method: str, *args: Any) -> Any:
        return getattr(self._responses, method)(*args)

    @ray.method(concurrency_group="batches")
    def batches(self, method: str, *args: Any) -> Any:
        return getattr(self._batches, method)(*args)

    @ray.method(concurrency_group="ledger")
    def ledger(self, method: str, *args: Any) -> Any:
        return getattr(self._ledger, method)(*args)

    @ray.method(concurrency_group="key_watch")
    def ledger_watch(self, method: str, *args: Any) -> Any:
        """`Ledger.wait_keys` alone: it blocks, and touches no database."""
        if method != "wait_keys":
            raise ValueError(f"{method} is not a wait of the ledger")
        return self._ledger.wait_keys(*args)


def connect_stores(settings: StoreSettings, state_resource: str | None = None) -> Any:
    """The namespace's stores: the existing actor, or a new one where the controller goes.
    Get-or-create is atomic in Ray, so gateways starting together still share one."""
    return (
        # Ray's stubs omit `concurrency_groups`, which only `ray.remote` (not `.options`) takes.
        ray.remote(concurrency_groups={**dict.fromkeys(PARTS, 1), "key_watch": KEY_WATCHERS})(  # type: ignore[call-overload]
            StoreHost
        )
        .options(
            name=STORES_NAME,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_restarts=-1,
            **state_actor_options(state_resource),
        )
        .remote(settings)
    )
