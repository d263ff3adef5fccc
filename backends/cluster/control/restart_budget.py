"""How many dead replicas a deployment may still replace: its restart budget.

The budget is a rate, not a lifetime count: at most `max_restarts` replacements within
`RESTART_WINDOW_SECONDS`. A lifetime count let a few isolated crashes (one poison request each,
issue #12) leave a model `failed` for good; now a replica refused for the budget is tried again
once the oldest restart has left the window, so a crash loop is slowed, never made permanent.
This bookkeeping (a clock, a window, the times of recent restarts) is kept apart from
`Deployment`'s state machine (deployment.py), which only asks it whether, or when, it may restart.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# `max_restarts` counts replacements within this many seconds (module docstring).
RESTART_WINDOW_SECONDS = 600.0
# The restart window's clock (a name of its own, so tests can move it without moving asyncio's).
restart_clock: Callable[[], float] = time.monotonic


class RestartBudget:
    """The times of one deployment's recent restarts, oldest first, and what they allow."""

    def __init__(self) -> None:
        self._restarted_at: deque[float] = deque()  # monotonic times, oldest first

    @property
    def used(self) -> int:
        """Restarts within the window, as of the last `wait`, `record` or `reset`."""
        return len(self._restarted_at)

    @property
    def window(self) -> float:
        """The window's length in seconds (read when asked, so tests can change it)."""
        return RESTART_WINDOW_SECONDS

    def wait(self, limit: int) -> float | None:
        """None if a restart is within the budget now; else seconds until one is (inf: never,
        `max_restarts: 0`). Forgets restarts older than the window."""
        now = restart_clock()
        while self._restarted_at and now - self._restarted_at[0] >= RESTART_WINDOW_SECONDS:
            self._restarted_at.popleft()
        if self.used < limit:
            return None
        if not self._restarted_at:
            return float("inf")
        return max(0.0, self._restarted_at[-limit] + RESTART_WINDOW_SECONDS - now)

    def record(self) -> None:
        """Count a restart made now."""
        self._restarted_at.append(restart_clock())

    def reset(self) -> None:
        """Forget every restart (a deploy, scale or update starts the count again)."""
        self._restarted_at.clear()
