"""The once-per-process warning about request fields the gateway does not know."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from protocol.base import RequestModel

log = logging.getLogger(__name__)


# Distinct (endpoint, field) pairs remembered: clients sending made-up names must not grow the
# set (or the log) without bound.
MAX_NOTED = 256


@dataclass
class UnknownFieldLog:
    """Logs each unknown request field once per process: useful, and not a log flood.

    Request bodies accept unknown fields (protocol/base.py) because OpenAI clients add fields all
    the time; an operator still wants to know which ones are being ignored. Past `MAX_NOTED`
    names one last line says so and the rest go unlogged.
    """

    seen: set[str] = field(default_factory=set)
    limit: int = MAX_NOTED

    def note(self, endpoint: str, body: RequestModel) -> None:
        for name in body.model_extra or {}:
            key = f"{endpoint}:{name}"
            if key in self.seen or len(self.seen) > self.limit:
                continue
            if len(self.seen) == self.limit:
                self.seen.add("")  # the marker: the limit's line is written once
                log.warning("more than %d unknown request fields seen; no longer logging them", self.limit)
                continue
            self.seen.add(key)
            log.warning("ignoring unknown field %r on %s", name[:100], endpoint)
