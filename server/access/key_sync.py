"""Keeping the gateway's copy of the database keys current: revocation within a second.

The ledger actor holds the keys (`backends/cluster/stores/ledger.py`); each gateway asks it every
`POLL_S` for its list's version, and only when that changed for the list itself, so a key created,
rotated or revoked through any gateway works (or stops working) on every gateway well within a
second. A poll is one small actor call; a ledger that is restarting is asked again on the next
round, and until then the gateway keeps the list it has.
"""

from __future__ import annotations

import asyncio
import logging

from raygate.backends.cluster.stores.ledger import LedgerClient
from raygate.server.access.auth import KeyStore

log = logging.getLogger(__name__)

POLL_S = 0.25


class KeySync:
    """Polls the ledger for its keys and hands them to the `KeyStore`."""

    def __init__(self, keys: KeyStore, ledger: LedgerClient) -> None:
        self._keys = keys
        self._ledger = ledger
        self._version: str | None = None

    async def refresh(self) -> None:
        version, keys = await self._ledger.call("keys", self._version)
        if keys is not None:
            self._keys.set_stored(keys)
            if self._version is not None:
                log.info("API keys from the ledger: %d active", len(keys))
        self._version = version

    async def run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.refresh()
            except Exception as exc:  # the ledger restarting: keep the keys we have, ask again
                log.warning("could not refresh API keys from the ledger: %s", exc)
