"""The batched engine's slots as a prompt cache, as llama-server's are: what each slot's KV cells
hold, which slot a new prompt goes to, and the host copies of slots about to be overwritten.

Each slot remembers the tokens in its KV cells after its request ends, and a new prompt goes to
the free slot sharing the longest prefix with it (a repeated system prompt, the earlier turns of a
conversation), evaluating only the rest. A slot is only taken for its prefix when that prefix is
most of what it holds (`prompt_store.SIMILARITY`); otherwise the least recently used free slot is,
so one short shared opening (a chat template's default system prompt) does not evict a long
conversation another client is about to continue; of those, one next to the running slots:
llama.cpp decodes each run of consecutive sequence ids as a micro-batch of its own, a pass over
all the weights (`decode_batch.fill` keeps slot order).

A slot about to be overwritten is first copied to host memory (`prompt_store.py`, llama-server's
`--cache-ram`; `engine: {prompt_cache_ram_mib: N}`, 0 turns it off), and a prompt that extends a
stored one further than any slot does is copied back into its slot: with more conversations than
slots, each still evaluates only its new turn. One that opens as a running prompt does copies
that prefix from the other's slot once it is evaluated (`decode_batch.donor`).

A slot also remembers the adapter set (`lora.py`) its cells were computed under, and gives its
prefix only to a prompt under the same set; the host store serves base-model prompts only.

Everything here runs on the engine's scheduler thread, which owns the context.
"""

from __future__ import annotations

import ctypes
import itertools
import time
from collections.abc import Callable
from typing import Any

import llama_cpp

from raygate.backends.engines.base import EngineStats
from raygate.backends.engines.llama_cpp import prefix_reuse
from raygate.backends.engines.llama_cpp.decode_batch import RunningSequence, donor
from raygate.backends.engines.llama_cpp.lora import LoraKey
from raygate.backends.engines.llama_cpp.prompt_store import (
    PromptStore,
    StoredPrompt,
    common_prefix,
    pick_slot,
)
from raygate.backends.engines.llama_cpp.vision import span_floor

# A slot's state goes to the host store only if at least this many of its tokens would be lost
# (a copy costs ~0.3 ms per 100 tokens of SmolLM2; a short prefix is cheaper to evaluate again).
STORE_MIN_TOKENS = 32


class Slots:
    """`n_seq` slots, one KV sequence each (module docstring). `cached[slot]`: the tokens its cells
    hold, in order; `used[slot]`: when it last took a request (least recently used first)."""

    def __init__(self, n_seq: int, store: PromptStore, enabled: bool, stats: EngineStats) -> None:
        """`enabled`: `engine: {prompt_cache: ...}`; off, every prompt is evaluated whole."""
        self.cached: list[list[int]] = [[] for _ in range(n_seq)]
        self.used = [0] * n_seq
        self.enabled = enabled
        self.store = store
        self._keys: list[LoraKey] = [() for _ in range(n_seq)]
        self._clock = itertools.count(1)
        self._stats = stats
        self._ctx: Any = None
        self._reevaluated = prefix_reuse.REEVALUATED

    def bind(self, ctx: Any, reevaluated: int | None = None) -> None:
        """The context whose KV cells these are; `reevaluated`: `prefix_reuse.reevaluated_tokens`,
        measured on the scheduler thread (None: the default)."""
        self._ctx = ctx
        if reevaluated is not None:
            self._reevaluated = reevaluated

    def drop(self, slot: int) -> None:
        """Empty the slot: its cells hold nothing usable (a failed decode, a half-fed image)."""
        self.cached[slot] = []
        llama_cpp.llama_memory_seq_rm(self._ctx.memory, slot, -1, -1)

    def place(self, seq: RunningSequence, running: dict[int, RunningSequence]) -> None:
        """Put `seq` in the free slot that serves its prompt best, reusing what the slot (or the host
        store) holds of it."""
        cached = self.cached
        drawn = not seq.first  # its first token came from kept logits (`generate`), or it resumes
        free = [s for s in range(len(cached)) if s not in running]
        slot = pick_slot(free, cached, self.used, seq.prompt, running)
        # Prompt logprobs need every position's logits: nothing cached can be reused.
        reuse = self.enabled and seq.prompt_top is None
        same = self._keys[slot] == seq.lora
        shared = common_prefix(cached[slot], seq.prompt) if reuse and same else 0
        entry, stored = self.store.best(seq.prompt) if reuse and not seq.lora else (None, 0)
        if len(cached[slot]) - shared > STORE_MIN_TOKENS and self._keys[slot] == ():
            self._store_slot(slot)  # what the prompt would overwrite
        if entry is not None and stored > shared + STORE_MIN_TOKENS:
            shared = self._restore(slot, entry, stored)
        # A drawn first token needs no logits: the prompt's cells are all it needs, and a
        # slot evicted since evaluates the rest without them. Otherwise the last token (or
        # two) is evaluated again for its logits; never below 0: a prompt shorter than the
        # tokens re-evaluated gave -1, fed nothing that was sampled, and waited for ever.
        last = len(seq.prompt) - (0 if drawn else self._reevaluated)
        keep = span_floor(seq.images, max(0, min(shared, last)))
        llama_cpp.llama_memory_seq_rm(self._ctx.memory, slot, keep, -1)
        del cached[slot][keep:]
        self.used[slot] = next(self._clock)
        self._keys[slot] = seq.lora
        seq.slot, seq.fed = slot, keep
        if reuse and not seq.images:
            seq.follows = donor(seq, running, keep, last, STORE_MIN_TOKENS)
        if not seq.resumed:  # a resumed sequence's usage counted its cached prompt already
            seq.out.builder.cached_tokens = keep
            seq.out.builder.queued = (seq.arrived, time.time())
            if seq.prompt_top is None and seq.follows is None:
                self._stats.count_prompt_cache(keep)
        running[slot] = seq

    def share_prefixes(self, running: dict[int, RunningSequence]) -> None:
        """Give each waiting follower its copy once its donor has the prefix (`_follow`), and hold
        every donor at the prefix its followers still wait for."""
        for slot, seq in running.items():
            seq.hold = 0
            if seq.follows is not None:
                self._follow(slot, seq, running)
        for seq in running.values():
            if seq.follows is not None:
                leader, n = seq.follows
                leader.hold = max(leader.hold, n)

    def _follow(self, slot: int, seq: RunningSequence, running: dict[int, RunningSequence]) -> None:
        """Copy the prefix `seq` shares with its donor (`decode_batch.donor`) into `seq`'s slot once the donor
        has evaluated it; if the donor left its slot first (ended, failed, preempted), `seq`
        evaluates its prompt itself. llama.cpp copies a slot (a KV stream of its own) whole, on
        the next decode; the cells past the prefix are dropped at once."""
        assert seq.follows is not None
        leader, n = seq.follows
        if running.get(leader.slot) is not leader:
            seq.follows = None
        elif leader.fed >= n:
            memory = self._ctx.memory
            llama_cpp.llama_memory_seq_rm(memory, slot, -1, -1)
            llama_cpp.llama_memory_seq_cp(memory, leader.slot, slot, -1, -1)
            llama_cpp.llama_memory_seq_rm(memory, slot, n, -1)
            self.cached[slot] = self.cached[leader.slot][:n]
            seq.fed, seq.follows = n, None
            if not seq.resumed:
                seq.out.builder.cached_tokens = n
        else:
            return
        if not seq.resumed and seq.prompt_top is None:
            self._stats.count_prompt_cache(seq.fed)

    def store_likely(self, arrived: Callable[[], bool]) -> None:
        """Copy to the host store the slots a new prompt is likely to take, while the engine is
        idle: the least recently used (`pick_slot`'s choice for a new prompt with nothing running)
        and the one that just finished (sharing most with a prompt that follows it, such as the
        next question after the same opening). Those copies (1-1.5 ms for a ~170-token slot,
        4.4 ms for ~500, measured through the gateway) were otherwise made at admission, inside the
        next request's time to first token; once a slot is stored, admission finds it there and
        copies nothing. Each copy starts only while nothing has `arrived`."""
        if not self.enabled:
            return
        by_age = sorted(range(len(self.cached)), key=self.used.__getitem__)
        for slot in dict.fromkeys((by_age[0], by_age[-1])):
            if arrived():
                return
            if len(self.cached[slot]) > STORE_MIN_TOKENS and self._keys[slot] == ():
                self._store_slot(slot)

    def _restore(self, slot: int, entry: StoredPrompt, shared: int) -> int:
        """Copy a stored state back into `slot`, which shares `shared` tokens with the prompt then.
        Returns the prefix the slot now shares with the prompt (0 if llama.cpp refused the copy)."""
        llama_cpp.llama_memory_seq_rm(self._ctx.memory, slot, -1, -1)
        size = len(entry.state)
        read = llama_cpp.llama_state_seq_set_data(
            self._ctx.ctx, (ctypes.c_uint8 * size).from_buffer(entry.state), size, slot
        )
        if read != size:
            self.drop(slot)  # nothing usable restored: the slot is empty
            return 0
        # It stays stored: requests that arrive together after the same opening (a burst after a
        # restart, say) each restore it into their own slot, instead of the first taking it and
        # the rest evaluating the opening again.
        self.store.refresh(list(entry.tokens))
        self.cached[slot] = list(entry.tokens)
        self._stats.prompt_cache_restored_total += 1
        return shared

    def _store_slot(self, slot: int) -> None:
        """Copy the slot's KV cells to the host store (skipped when the store is off, too small,
        or holds these tokens already)."""
        tokens, store, ctx = self.cached[slot], self.store, self._ctx.ctx
        if not store.capacity or not tokens or store.refresh(tokens):
            return
        size = llama_cpp.llama_state_seq_get_size(ctx, slot)
        if size > store.capacity:
            return
        state = store.buffer(size)
        view = (ctypes.c_uint8 * size).from_buffer(state)
        written = llama_cpp.llama_state_seq_get_data(ctx, view, size, slot)
        del view  # the array may shrink only once nothing points into it
        if written:
            del state[written:]
            store.put(tokens, state)
