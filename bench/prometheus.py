"""One sample's value out of Prometheus' text format, by name and labels: how the benchmark reads a
server's counters around its runs, and how the tests read the gateway's `/metrics`."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name{labels...}` (extra labels on the sample are fine); None if absent."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None
