"""The logits at the last position of the batched engine's latest prompts, one row each.

Why: a prompt sent again exactly (a retry, a regenerated answer) has the same next-token
distribution, since logits are a function of the prompt's tokens alone. With that row kept, its
first token is drawn the moment it arrives, with no decode, where llama-server evaluates the last
prompt token again. A row is ~200 KB for a 49k vocabulary, so only as many are kept as the engine
has slots, the oldest out first.

Written by the scheduler thread, read by the event loop: a dict's get and set are atomic, and a
stored row is never written again (a token mask changes a row only while it draws, and undoes it).
"""

from __future__ import annotations

import numpy as np


class KeptLogits:
    """Bounded: the `capacity` most recently kept prompts."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    def get(self, prompt: list[int]) -> np.ndarray | None:
        return self._rows.get(tuple(prompt))

    def put(self, prompt: list[int], row: np.ndarray) -> None:
        """Keep a copy of `row` (a view into llama.cpp's output buffer, overwritten next decode)."""
        key = tuple(prompt)
        self._rows.pop(key, None)
        self._rows[key] = row.copy()
        while len(self._rows) > self._capacity:
            del self._rows[next(iter(self._rows))]
