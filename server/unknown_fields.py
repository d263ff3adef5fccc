"""The once-per-process warning about request fields the gateway does not know."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from protocol.base import RequestModel

log = logging.getLogger(__name__)


@dataclass
class UnknownFieldLog:
    """Logs each unknown request field once per process: useful, and not a log flood.

    Request bodies accept unknown fields (protocol/base.py) because OpenAI clients add fields all
    the time; an operator still wants to know which ones are being ignored.
    """

    seen: set[str] = field(default_factory=set)

    def note(self, endpoint: str, body: RequestModel) -> None:
        for name in body.model_extra or {}:
            key = f"{endpoint}:{name}"
            if key not in self.seen:
                self.seen.add(key)
                log.warning("ignoring unknown field %r on %s", name, endpoint)
