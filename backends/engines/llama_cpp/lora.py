"""GGUF LoRA adapters on one llama.cpp model, loaded on first use within `max_loras`, and the
adapter set a context decodes under.

llama.cpp keeps the adapters on the model and the active set (with scales) on a context, changed
between decodes with `llama_set_adapters_lora` (a no-op when the set is the same; a change makes
the next decode reserve its graph again). Both engines call everything here that touches llama.cpp
on the thread that owns the context: loading adds the adapter to the model's list that a decode's
graph reservation reads.

Registered is not loaded: `register` reads the file once (a bad one is refused at once, naming
it), and with `max_loras` set (`lora: {max_loras: N}` in the spec) at most N adapters stay in
memory. A sequence `acquire`s its set before its first decode: what is missing is read again from
its file, evicting the least recently used adapter that no running sequence decodes under; when
every loaded one is in use the sequence waits (`acquire` says no) until one is released. A request
needing more adapters than `max_loras` at once can never run: 400 when it arrives.

A request names its adapters (`GenerateRequest.lora`); `key` turns the names into the set the
engines key their prompt caches by: each registration gets an id that is never reused, so a prefix
computed under one set is never reused under another, while an adapter evicted and read again
from the same file keeps its cached prefixes. Unregistering while a running sequence still decodes
under the adapter only retires it: requests that arrive later are refused, and the adapter is freed
once nothing uses it.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raygate.protocol.errors import BadRequestError, ModelNotFoundError

# What a context decodes under: (adapter id, scale) pairs, sorted; () is the base model alone.
LoraKey = tuple[tuple[int, float], ...]


@dataclass(eq=False)
class _Adapter:
    name: str
    path: str
    pointer: Any = None  # the `llama_adapter_lora *` ctypes object while loaded
    users: int = 0  # running sequences that decode under it
    retired: bool = False  # unregistered: freed when its last user ends


class LoraAdapters:
    """The adapters registered on one model, by name; at most `max_loaded` of them in memory."""

    def __init__(self, max_loaded: int | None = None) -> None:
        self._max = max_loaded
        self._by_name: dict[str, int] = {}  # name -> id
        self._adapters: dict[int, _Adapter] = {}  # id -> adapter, registered or still in use
        self._lru: dict[int, None] = {}  # loaded ids, least recently acquired first
        self._ids = itertools.count(1)
        self._active: dict[int, LoraKey] = {}  # context address -> its set
        self.loads = 0  # files read (first loads and reloads after an eviction)
        self.evictions = 0

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    @property
    def loaded(self) -> list[str]:
        """Names of the adapters in memory, least recently used first."""
        return [self._adapters[i].name for i in self._lru]

    def register(self, model: Any, ctx: Any, name: str, path: str) -> None:
        """Blocking (reads the file, which must be a LoRA for `model`, the `llama_model` pointer).
        It stays loaded if there is room, evicting an idle adapter if need be."""
        if name in self._by_name:
            raise BadRequestError(f"LoRA adapter `{name}` is already loaded.", param="lora_name")
        adapter = _Adapter(name, path)
        self._read(model, adapter)
        adapter_id = next(self._ids)
        self._by_name[name] = adapter_id
        self._adapters[adapter_id] = adapter
        self._lru[adapter_id] = None
        self._trim(ctx, keep=(adapter_id,))
        if self._max is not None and len(self._lru) > self._max:
            self._evict(ctx, adapter_id)  # every other one is in use: checked, loaded on first use

    def unregister(self, ctx: Any, name: str) -> None:
        """New requests for it are refused from now on; freed now if nothing runs under it."""
        adapter_id = self._by_name.pop(name, None)
        if adapter_id is None:
            raise ModelNotFoundError(f"LoRA adapter `{name}` is not loaded.", param="lora_name")
        adapter = self._adapters[adapter_id]
        adapter.retired = True
        if not adapter.users:
            self._forget(ctx, adapter_id)

    def key(self, lora: Iterable[tuple[str, float]]) -> LoraKey:
        """The set a request decodes under; 404 naming an adapter that is not registered, 400 for a
        set that could never fit in `max_loras`."""
        key: dict[int, float] = {}
        for name, scale in lora:
            adapter_id = self._by_name.get(name)
            if adapter_id is None:
                raise ModelNotFoundError(
                    f"The model `{name}` does not exist or you do not have access to it "
                    "(no such LoRA adapter is loaded).",
                    param="model",
                )
            if scale != 0.0:
                key[adapter_id] = float(scale)
        if self._max is not None and len(key) > self._max:
            raise BadRequestError(
                f"The request applies {len(key)} LoRA adapters at once; this model holds at most "
                f"{self._max} (`lora.max_loras`).",
                param="lora",
            )
        return tuple(sorted(key.items()))

    def acquire(self, model: Any, ctx: Any, key: LoraKey) -> bool:
        """Make every adapter of `key` loaded and count one more sequence under each (until
        `release`). False, changing nothing, when there is no room: every loaded adapter not in
        `key` is in use. Blocking when it reads a file; a file that is gone or changed raises."""
        ids = [a for a, _ in key]
        if any(a not in self._adapters for a in ids):  # unloaded while the request waited
            raise ModelNotFoundError(
                "A LoRA adapter of this request was unloaded before it started.", param="model"
            )
        missing = [a for a in ids if self._adapters[a].pointer is None]
        if self._max is not None and missing:
            idle = [a for a in self._lru if not self._adapters[a].users and a not in ids]
            if len(self._lru) + len(missing) - len(idle) > self._max:
                return False
        for adapter_id in missing:
            self._trim(ctx, keep=ids, room=1)
            self._read(model, self._adapters[adapter_id])
            self.loads += 1
            self._lru[adapter_id] = None
        for adapter_id in ids:
            self._adapters[adapter_id].users += 1
            self._lru.pop(adapter_id)
            self._lru[adapter_id] = None  # most recently used
        return True

    def release(self, ctx: Any, key: LoraKey) -> None:
        """A sequence under `key` ended: a retired adapter is freed with its last user."""
        for adapter_id, _ in key:
            adapter = self._adapters[adapter_id]
            adapter.users -= 1
            if adapter.retired and not adapter.users:
                self._forget(ctx, adapter_id)

    def apply(self, ctx: Any, key: LoraKey) -> None:
        """Make `ctx` decode under `key` (acquired: loaded; nothing to do when it already does)."""
        import llama_cpp

        address = _address(ctx)
        if self._active.get(address, ()) == key:
            return
        n = len(key)
        pointers = (self._adapters[a].pointer for a, _ in key)
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*pointers)
        scales = (ctypes.c_float * n)(*(s for _, s in key))
        rc = llama_cpp.llama_set_adapters_lora(ctx, adapters if n else None, n, scales if n else None)
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora returned {rc}")
        self._active[address] = key

    # -- loading and freeing ------------------------------------------------------------------

    def _read(self, model: Any, adapter: _Adapter) -> None:
        import llama_cpp

        pointer = llama_cpp.llama_adapter_lora_init(model, adapter.path.encode())
        if not pointer:
            raise BadRequestError(
                f"LoRA adapter `{adapter.name}`: {adapter.path} is not a GGUF LoRA adapter for this "
                "model (llama.cpp refused it: a missing or unreadable file, another format, or an "
                "adapter of another base model).",
                param="lora_path",
            )
        adapter.pointer = pointer

    def _trim(self, ctx: Any, keep: Iterable[int], room: int = 0) -> None:
        """Evict idle adapters, least recently used first, until `room` more fit."""
        if self._max is None:
            return
        kept = set(keep)
        for adapter_id in list(self._lru):
            if len(self._lru) + room <= self._max:
                return
            if adapter_id not in kept and not self._adapters[adapter_id].users:
                self._evict(ctx, adapter_id)
                self.evictions += 1

    def _evict(self, ctx: Any, adapter_id: int) -> None:
        """Free the adapter's weights (it stays registered). `ctx` must not keep a freed adapter."""
        import llama_cpp

        adapter = self._adapters[adapter_id]
        if any(a == adapter_id for a, _ in self._active.get(_address(ctx), ())):
            self.apply(ctx, ())
        self._lru.pop(adapter_id, None)
        if adapter.pointer is not None:
            llama_cpp.llama_adapter_lora_free(adapter.pointer)
            adapter.pointer = None

    def _forget(self, ctx: Any, adapter_id: int) -> None:
        self._evict(ctx, adapter_id)
        del self._adapters[adapter_id]


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0
