"""`PromptStore`: the host-memory copies of evicted prompt-cache slots, without a model (the
engine's use of it, on the real SmolLM2, is in tests/engine/test_prompt_cache.py)."""

from __future__ import annotations

import random
import sys

from raygate.backends.engines.llama_cpp.prompt_store import PromptStore, common_prefix, held, pick_slot, runs


def test_the_longest_shared_prefix_wins() -> None:
    store = PromptStore(1000)
    store.put([1, 2, 3], bytearray(b"abc"))
    store.put([1, 2, 9, 9], bytearray(b"abcd"))
    entry, shared = store.best([1, 2, 3, 4])
    assert entry is not None and entry.tokens == (1, 2, 3) and shared == 3
    assert store.best([7, 8]) == (None, 0)


def test_a_longer_state_of_the_same_conversation_supersedes_the_shorter() -> None:
    store = PromptStore(1000)
    store.put([1, 2], bytearray(b"ab"))
    store.put([1, 2, 3, 4], bytearray(b"abcd"))
    assert len(store) == 1 and store.used == 4


def test_least_recently_stored_goes_first_when_bytes_run_out() -> None:
    store = PromptStore(10)
    store.put([1], bytearray(b"xxxx"))
    store.put([2], bytearray(b"yyyy"))
    store.put([3], bytearray(b"zzzz"))  # 12 bytes > 10: [1] leaves
    assert store.best([1]) == (None, 0)
    assert store.best([2])[1] == 1 and store.best([3])[1] == 1 and store.used == 8


def test_a_state_larger_than_the_store_or_an_empty_one_is_not_kept() -> None:
    store = PromptStore(3)
    assert not store.put([1, 2], bytearray(b"abcd"))
    assert not store.put([], bytearray(b"a"))
    assert len(store) == 0 and store.used == 0


def test_a_state_stored_for_the_same_tokens_is_only_refreshed() -> None:
    store = PromptStore(8)
    store.put([1], bytearray(b"xxxx"))
    store.put([2], bytearray(b"yyyy"))
    assert store.refresh([1]) and not store.refresh([3]) and not store.refresh([1, 2])
    store.put([3], bytearray(b"zzzz"))  # over capacity: the least recently used, now [2], leaves
    assert store.best([1])[1] == 1 and store.best([2]) == (None, 0)


def test_a_slot_is_chosen_for_its_prefix_then_to_keep_running_slots_together() -> None:
    """llama.cpp decodes each run of consecutive sequence ids as its own micro-batch: with nothing
    worth reusing, a new stream goes next to the running ones, the least recently used of those."""
    cached: list[list[int]] = [[], [], [], [], [5, 6, 7], [], [], []]
    used = [5, 1, 0, 6, 2, 7, 3, 4]
    free = [0, 1, 2, 4, 6, 7]
    # Nothing runs: the least recently used free slot, as before.
    assert pick_slot(free, cached, used, [9, 9]) == 2
    # Slots 3 and 5 run: 4 joins them into one run (it holds no useful prefix for this prompt).
    assert pick_slot(free, cached, used, [9, 9], running=[3, 5]) == 4
    # Slot 3 runs: 2 and 4 both keep one run, and 2 is the less recently used.
    assert pick_slot(free, cached, used, [9, 9], running=[3]) == 2
    # A prefix that is most of what a slot holds wins over keeping slots together.
    assert pick_slot(free, cached, used, [5, 6, 7, 8], running=[0, 1]) == 4
    assert runs({0, 1, 3}) == 2 and runs(set()) == 0 and runs({7}) == 1


def test_common_prefix_is_the_leading_run_of_equal_tokens() -> None:
    """Against the plain loop it replaced, on short sequences over a tiny vocabulary (so that
    long shared runs, full matches and empty inputs all occur), lists and tuples mixed."""
    rng = random.Random(7)

    def loop(a: list[int], b: list[int]) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n

    for _ in range(5000):
        a = [rng.randrange(3) for _ in range(rng.randrange(12))]
        b = [rng.randrange(3) for _ in range(rng.randrange(12))]
        assert common_prefix(a, b) == common_prefix(tuple(a), b) == loop(a, b), (a, b)


def test_a_copy_reuses_the_buffer_of_a_state_that_left() -> None:
    """Its pages are mapped already: a fresh buffer costs page faults before the prompt that
    overwrites the slot can run. Evicted and superseded states give theirs."""
    store = PromptStore(capacity=100)
    first = bytearray(60)
    store.put([1, 2, 3], first)
    store.put([4, 5, 6], bytearray(60))  # over capacity: [1, 2, 3] is evicted
    reused = store.buffer(50)
    assert reused is first and len(reused) == 50
    assert store.buffer(50) is not first  # each buffer serves one copy
    assert len(store.buffer(200)) == 200  # none large enough: a new one
    second = store.best([4, 5, 6])[0]
    assert second is not None
    store.put([4, 5, 6, 7], bytearray(60))  # extends [4, 5, 6], which it supersedes
    assert store.buffer(10) is second.state


def test_the_bound_counts_the_memory_a_reused_buffer_holds() -> None:
    """A spare cut to a smaller state keeps its allocation: counted by length, the store held up
    to twice its bound (issue 51's chat replica RSS)."""
    store = PromptStore(capacity=10_000)
    store.put([1], bytearray(6000))
    store.put([2], bytearray(6000))  # [1] is evicted; its buffer becomes a spare
    reused = store.buffer(3100)
    assert len(reused) == 3100 and held(reused) >= 6000 and sys.getsizeof(reused) > 6000  # kept
    store.put([3], reused)
    assert store.best([2])[1] == 0  # 6000 + 6000 held: over the bound, so [2] left
    assert store.best([3])[1] == 1
    assert store.used == held(reused) <= store.capacity
