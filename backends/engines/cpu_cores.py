"""How many cores this process may use: what `n_threads: auto` (and `auto-N`) means.

The CPU affinity says which cores the process may run on (all of a machine's, unless `taskset` or
a container's `--cpuset-cpus` narrowed it), but not how much of them: a container limited with
`--cpus 2` (Kubernetes `limits.cpu`) sees every core of the host and gets two cores' worth of
time. A llama.cpp thread per visible core there would mean dozens of threads sharing two cores'
time, each barrier waiting on a descheduled thread, so the cgroup's CPU quota caps the count.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
_SETTING = re.compile(r"(\d+)|auto(?:-(\d+))?")


def usable_cores(cgroup: Path = CGROUP) -> int:
    """The cores of the affinity mask, at most the cgroup's CPU quota rounded up; at least 1."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(cgroup)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPU time this cgroup may use, in cores (cgroup v2 `cpu.max`, else v1's CFS quota);
    None when unlimited or unreadable."""
    try:
        fields = (cgroup / "cpu.max").read_text().split()
        if fields and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        if fields:
            return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def thread_count(value: object, cgroup: Path = CGROUP) -> object:
    """An `engine:` thread setting as a number: `auto` is every usable core, `auto-N` all but N
    (at least one); anything else is returned as it is, for llama.cpp to take or refuse."""
    if not isinstance(value, str):
        return value
    match = _SETTING.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"a thread count is a number, `auto` or `auto-N` (every core but N), not {value!r}")
    if match.group(1) is not None:
        return int(match.group(1))
    return max(1, usable_cores(cgroup) - int(match.group(2) or 0))
