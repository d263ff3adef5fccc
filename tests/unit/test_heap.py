"""backends/heap.py: the startup heap is frozen, later objects are still collected."""

from __future__ import annotations

import gc
import weakref

from raygate.backends.heap import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_the_startup_heap_is_frozen_and_new_cycles_are_still_collected() -> None:
    try:
        frozen = freeze_startup_heap()
        assert frozen > 0
        assert frozen == gc.get_freeze_count()
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a reference cycle made after the freeze
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()  # the rest of the test session collects as before
