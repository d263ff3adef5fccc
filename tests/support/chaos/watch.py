"""Memory and open files of the chaos run's processes, sampled through the run, and their slopes.

A process is followed by role and pid: a replica replaced by the fault schedule is a new process
and starts a new series, so a slope is a growth in one process's life, not a restart's step.
Growth is judged after the warm-up (the first third of the run): imports, pools and caches settle
first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bench.servers import cmdline, descendants, maps_file, rss_mb


@dataclass
class Series:
    role: str
    pid: int
    t: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    def slopes(self, after: float) -> tuple[float, float] | None:
        """Least-squares slope of RSS (MiB per hour) and of open files (per hour) over the samples
        taken after `after`; None with fewer than 4 such samples (too short a life to judge)."""
        points = [(t, r, f) for t, r, f in zip(self.t, self.rss_mb, self.fds, strict=True) if t >= after]
        if len(points) < 4:
            return None
        return _slope([(t, r) for t, r, _ in points]) * 3600, _slope([(t, f) for t, _, f in points]) * 3600


def _slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def _open_files(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


@dataclass
class Watch:
    """`roots`: the pids whose descendants are the cluster's processes (each node's `ray start`);
    `gateways` by name; `models`: a model's weights file, which names the replicas that map it."""

    models: dict[str, Path]
    series: dict[tuple[str, int], Series] = field(default_factory=dict)

    def roles(self, roots: list[int], gateways: dict[str, int]) -> dict[int, str]:
        found = {pid: name for name, pid in gateways.items()}
        for root in roots:
            for pid in descendants(root):
                cmd = cmdline(pid)
                if "ray::Controller" in cmd:
                    found[pid] = "controller"
                elif "ModelWorker" in cmd:  # named by the weights it maps; none yet: still loading
                    model = next((m for m, path in self.models.items() if maps_file(pid, path)), None)
                    if model is not None:
                        found[pid] = f"replica {model}"
        return found

    def sample(self, now: float, roots: list[int], gateways: dict[str, int]) -> None:
        for pid, role in self.roles(roots, gateways).items():
            rss, fds = rss_mb(pid), _open_files(pid)
            if rss is None or fds is None:
                continue
            s = self.series.setdefault((role, pid), Series(role, pid))
            s.t.append(now)
            s.rss_mb.append(rss)
            s.fds.append(fds)
