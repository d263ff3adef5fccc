"""Host-memory copies of evicted prompt-cache slots (llama-server's `--cache-ram`).

The batched engine's slots hold one prompt each; with more conversations than slots, a slot taken
for a new prompt used to lose its KV cache, and the conversation it held evaluated its whole
history again on its next turn. Before a slot is overwritten, its sequence state (llama.cpp's
`llama_state_seq_get_data`: the KV cells of that sequence) is copied here; a later prompt that
extends a stored one further than any slot does has it copied back into its slot and evaluates
only the rest. Greedy output is unchanged: the restored cells are the ones the slot computed.

Bounded by bytes (`engine: {prompt_cache_ram_mib: N}`), least recently used out first. A stored
state whose tokens are a prefix of a newer one is dropped: the newer one serves both. The bytes
counted are the memory each buffer holds, not its length: a reused buffer cut to a smaller state
keeps its allocation (CPython shrinks a bytearray in place unless it loses over half), so counting
lengths let the store hold up to twice its bound (issue 51: the chat replica's RSS over an hour).
Pure Python and byte arrays: the engine does the llama.cpp calls, so this is tested without a model.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoredPrompt:
    """A slot's sequence state and the tokens it holds the KV cells of."""

    tokens: tuple[int, ...]
    # Written by llama.cpp in place and read back without a copy (a fresh 10 MB buffer costs
    # ~6 ms in page faults, and every copy as much again): a stored slot delayed the next first token.
    state: bytearray


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share. Slices compared in C, halving the span each
    time, rather than a Python loop over every token: admission compares the prompt with every
    slot and stored state, which share hundreds of tokens after a common opening (0.44 ms per
    admission for 8 slots and 40 states of ~400 tokens, measured, against ~0.1). A list and a
    tuple slice never compare equal, so the two are made one type first."""
    x, y = (a, b) if type(a) is type(b) else (tuple(a), tuple(b))
    lo, hi = 0, min(len(x), len(y))  # x[:lo] == y[:lo]; the answer is in lo..hi
    if x[:hi] == y[:hi]:
        return hi
    while hi - lo > 1:  # x[:hi] != y[:hi]
        mid = (lo + hi) // 2
        if x[lo:mid] == y[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


# Buffers of states that left the store kept for the next copies (`PromptStore.buffer`), beyond
# its capacity: two, so a copy after an eviction or a restore finds one.
SPARE_BUFFERS = 2

# A slot is chosen for its cached prefix only if that prefix is at least this share of what the
# slot holds (llama-server's `--slot-prompt-similarity` idea); else the least recently used one.
SIMILARITY = 0.5


def pick_slot(
    free: list[int],
    cached: list[list[int]],
    used: list[int],
    prompt: list[int],
    running: Collection[int] = (),
) -> int:
    """The free slot whose cached tokens share the longest prefix with `prompt`, if that prefix
    is most of what the slot holds (`SIMILARITY`); else, of the free slots that leave the running
    ones in the fewest runs of consecutive ids, the least recently used (`used`: when each slot
    last took a request). llama.cpp decodes each such run as a micro-batch of its own, a pass
    over all the weights: two streams in slots 3 and 7 cost two passes per token, in 3 and 4 one."""
    best = max(free, key=lambda s: (common_prefix(cached[s], prompt), -used[s]))
    shared = common_prefix(cached[best], prompt)
    if shared > 0 and shared >= SIMILARITY * len(cached[best]):
        return best
    taken = set(running)
    return min(free, key=lambda s: (runs(taken | {s}), used[s]))


def runs(slots: set[int]) -> int:
    """How many runs of consecutive ids `slots` make ({0, 1, 3}: two)."""
    return sum(1 for s in slots if s - 1 not in slots)


# What `sys.getsizeof` adds to a bytearray's length when its allocation fits it exactly.
_OVERHEAD = sys.getsizeof(bytearray(1)) - 1


def held(state: bytearray) -> int:
    """The bytes a state's buffer holds: its allocation, which may exceed its length."""
    return max(len(state), sys.getsizeof(state) - _OVERHEAD)


class PromptStore:
    """Stored sequence states by their tokens, within `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._spares: list[bytearray] = []  # buffers of states that left, for `buffer`
        self._entries: OrderedDict[tuple[int, ...], StoredPrompt] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: list[int]) -> tuple[StoredPrompt | None, int]:
        """The stored state sharing the longest prefix with `prompt`, and that length."""
        found, shared = None, 0
        key = tuple(prompt)  # the entries' type: compared without a conversion each
        for entry in self._entries.values():
            n = common_prefix(entry.tokens, key)
            if n > shared:
                found, shared = entry, n
        return found, shared

    def refresh(self, tokens: list[int]) -> bool:
        """Whether a state for exactly `tokens` is stored (it becomes the most recently used):
        a slot holding what is stored already need not be copied again (a prompt repeated word
        for word, answered the same way)."""
        key = tuple(tokens)
        if key not in self._entries:
            return False
        self._entries.move_to_end(key)
        return True

    def buffer(self, size: int) -> bytearray:
        """A buffer for a state of `size` bytes: one an evicted or superseded state gave up, whose
        pages are mapped already, or a new one. A fresh 9 MB buffer costs 2-4 ms in page faults
        (measured), llama.cpp's copy into a mapped one ~0.5 ms, and the copy runs before the
        prompt that overwrites the slot is evaluated."""
        for i, spare in enumerate(self._spares):
            if len(spare) >= size:
                del self._spares[i]
                del spare[size:]
                return spare
        return bytearray(size)

    def _drop(self, entry: StoredPrompt) -> None:
        self.used -= held(entry.state)
        self._spares.append(entry.state)
        self._spares.sort(key=len, reverse=True)  # the largest kept: any later state fits them
        del self._spares[SPARE_BUFFERS:]

    def put(self, tokens: list[int], state: bytearray) -> bool:
        """Store a slot's state; False if it is larger than the whole capacity."""
        size = held(state)
        if size > self.capacity or not tokens:
            return False
        key = tuple(tokens)
        for old in [k for k in self._entries if k == key[: len(k)]]:  # superseded by this one
            self._drop(self._entries.pop(old))
        self._entries[key] = StoredPrompt(key, state)
        self.used += size
        while self.used > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            self._drop(evicted)
        return True
