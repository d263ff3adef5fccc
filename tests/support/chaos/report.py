"""What the chaos run checks and how it says so: outcomes per API, errors judged against the fault
windows, heal times, and each process's growth; as Markdown tables.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tests.support.chaos.faults import Window
from tests.support.chaos.traffic import CLOSED, HUNG, OK, OLLAMA_5XX, REFUSED, SILENT, Outcome
from tests.support.chaos.watch import Series

# After a fault has healed, requests that began this long after it may still see its errors (a
# gateway's view of the registry refreshes, a retry-after expires).
GRACE_S = 20.0
# 5xx codes the gateway documents for a cluster in trouble: a replica died under a request, a model
# is (re)loading (with Retry-After), no replica is ready, the controller or a gateway is going away.
DOCUMENTED_5XX = {
    "replica_died",
    "model_loading",
    "not_ready",
    "no_capacity",
    "engine_dead",
    "draining",
    "controller_unreachable",
    "server_shutting_down",
    "service_unavailable",
    "overloaded_error",  # Anthropic's type for a 503 (its errors carry no code)
}
# Ollama's error body is only a message: its 5xx (OLLAMA_5XX) are judged by the fault windows.


def in_window(outcome: Outcome, windows: list[Window], fault: str | None = None) -> bool:
    """The request overlapped a fault (of kind `fault`, if given) or its grace period."""
    for w in windows:
        if fault is not None and w.fault != fault:
            continue
        healed = w.healed if w.healed is not None else float("inf")
        if outcome.started <= healed + GRACE_S and outcome.ended >= w.started:
            return True
    return False


@dataclass
class Verdict:
    outcomes: list[Outcome]
    windows: list[Window]
    series: list[Series]
    warm_after: float

    def violations(self) -> list[str]:
        """Every request that breaks the rules, described; empty when the run passed."""
        found = []
        for o in self.outcomes:
            if o.kind in (SILENT, HUNG):
                found.append(f"{o.kind}: {o.api} via {o.gateway} ({o.status}) {o.detail}")
            elif o.kind == REFUSED and o.code in ("connect", CLOSED):
                if not in_window(o, self.windows, "gateway restarted"):
                    found.append(f"connection {o.code} outside a gateway restart: {o.api} {o.detail}")
            elif o.code is not None and o.code.startswith("batch-"):  # a valid batch must complete
                found.append(f"batch ended {o.code[6:]}: {o.detail}")
            elif o.status >= 500 and o.code not in DOCUMENTED_5XX and o.code != OLLAMA_5XX:
                found.append(f"undocumented {o.status} {o.code}: {o.api} {o.detail}")
            elif o.status >= 500 and not in_window(o, self.windows):
                found.append(f"{o.status} {o.code} outside a fault's window: {o.api} {o.detail}")
        found.extend(f"not healed: {w.fault} ({w.note})" for w in self.windows if w.healed is None)
        # Losses first: a flood of one kind of refusal must not push them out of a shortened list.
        return sorted(found, key=lambda line: not line.startswith((SILENT, HUNG)))

    def table(self) -> str:
        by_api: dict[str, Counter[str]] = {}
        for o in self.outcomes:
            by_api.setdefault(o.api, Counter())[o.kind] += 1
        lines = [
            "| API | requests | ok | refused (visible) | silent | hung |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for api, c in sorted(by_api.items()):
            lines.append(f"| {api} | {sum(c.values())} | {c[OK]} | {c[REFUSED]} | {c[SILENT]} | {c[HUNG]} |")
        statuses = Counter(f"{o.status} {o.code or ''}".strip() for o in self.outcomes if o.kind == REFUSED)
        lines += ["", "Refusals: " + ", ".join(f"{k}: {v}" for k, v in statuses.most_common()) or "none"]
        lines += ["", "| fault | injected at (s) | healed in (s) | what |", "| --- | ---: | ---: | --- |"]
        t0 = min((o.started for o in self.outcomes), default=0.0)
        for w in self.windows:
            heal = "never" if w.heal_s is None else f"{w.heal_s:.1f}"
            lines.append(f"| {w.fault} | {w.started - t0:.0f} | {heal} | {w.note} |")
        lines += [
            "",
            "| process | samples | RSS first -> last (MiB) | RSS slope (MiB/h) | open files | files slope (/h) |",
        ]
        lines += ["| --- | ---: | ---: | ---: | ---: | ---: |"]
        for s in sorted(self.series, key=lambda s: (s.role, s.t[0])):
            slopes = s.slopes(self.warm_after)
            rss_slope, fd_slope = (
                ("n/a", "n/a") if slopes is None else (f"{slopes[0]:+.0f}", f"{slopes[1]:+.0f}")
            )
            lines.append(
                f"| {s.role} (pid {s.pid}) | {len(s.t)} | {s.rss_mb[0]:.0f} -> {s.rss_mb[-1]:.0f} | {rss_slope} "
                f"| {s.fds[0]} -> {s.fds[-1]} | {fd_slope} |"
            )
        return "\n".join(lines)
