"""Unknown request fields, logged once each and at most `MAX_LOGGED` of them per process.

OpenAI adds fields often, so an unknown one is accepted and worth one warning. A client can also
send thousands of made-up names per request: each would be "new" and the log would grow by
thousands of lines a request (and the set of names seen, by as many strings). So the first
`MAX_LOGGED` distinct names are logged (truncated), then one summary line says that further ones
are not; after that nothing more is logged or remembered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from raygate.protocol.base import RequestModel
from raygate.protocol.text import printable

log = logging.getLogger(__name__)

MAX_LOGGED = 64  # distinct field names logged per process (on the endpoint first seen)
MAX_NAME_CHARS = 64  # of a name, in the log line


@dataclass
class UnknownFieldLog:
    """Logs each unknown request field once, up to `max_logged` names per process (module docstring).

    Request bodies accept unknown fields (protocol/base.py) because OpenAI clients add fields all
    the time; an operator still wants to know which ones are being ignored.
    """

    max_logged: int = MAX_LOGGED
    seen: set[str] = field(default_factory=set)
    capped: bool = False

    def note(self, endpoint: str, body: RequestModel) -> None:
        if self.capped or not body.model_extra:
            return
        for name in body.model_extra:
            key = name  # per name, not per endpoint: a client's field is one warning
            if key in self.seen:
                continue
            if len(self.seen) >= self.max_logged:
                self.capped = True
                log.warning(
                    "ignoring unknown fields: %d distinct names logged, "
                    "further ones are ignored without a log line",
                    self.max_logged,
                )
                return
            self.seen.add(key)
            shown = printable(name[:MAX_NAME_CHARS]) + ("..." if len(name) > MAX_NAME_CHARS else "")
            log.warning("ignoring unknown field %r on %s", shown, endpoint)
