"""GGUF LoRA adapters on one llama.cpp model, and the adapter set a context decodes under.

llama.cpp keeps the adapters on the model and the active set (with scales) on a context, changed
between decodes with `llama_set_adapters_lora` (a no-op when the set is the same; a change makes
the next decode reserve its graph again). Both engines call everything here on the thread that
owns the context: loading adds the adapter to the model's list that a decode's graph reservation
reads.

A request names its adapters (`GenerateRequest.lora`); `key` turns the names into the set the
engines key their prompt caches by, so a prefix computed under one set is never reused under
another. Unloading while a running sequence still decodes under the adapter only retires it:
requests that arrive later are refused, and the adapter is freed once nothing uses it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

from raygate.protocol.errors import BadRequestError, ModelNotFoundError

# What a context decodes under: (adapter pointer, scale) pairs; () is the base model alone.
LoraKey = tuple[tuple[int, float], ...]


class LoraAdapters:
    """The adapters loaded on one model, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, int] = {}  # name -> adapter address
        self._pointers: dict[int, Any] = {}  # address -> the `llama_adapter_lora *` ctypes object
        self._retired: set[int] = set()
        self._active: dict[int, LoraKey] = {}  # context pointer -> its set

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def load(self, model: Any, name: str, path: str) -> None:
        """Blocking (reads the file). `model` is the `llama_model` pointer."""
        import llama_cpp

        if name in self._by_name:
            raise BadRequestError(f"LoRA adapter `{name}` is already loaded.", param="lora_name")
        adapter = llama_cpp.llama_adapter_lora_init(model, path.encode())
        if not adapter:
            raise BadRequestError(
                f"LoRA adapter `{name}`: {path} is not a GGUF LoRA adapter for this model "
                "(llama.cpp refused it: a missing or unreadable file, another format, or an "
                "adapter of another base model).",
                param="lora_path",
            )
        address = _address(adapter)
        self._by_name[name] = address
        self._pointers[address] = adapter

    def unload(self, name: str) -> None:
        adapter = self._by_name.pop(name, None)
        if adapter is None:
            raise ModelNotFoundError(f"LoRA adapter `{name}` is not loaded.", param="lora_name")
        self._retired.add(adapter)

    def key(self, lora: Iterable[tuple[str, float]]) -> LoraKey:
        """The set a request decodes under; 404 naming an adapter that is not loaded."""
        key: list[tuple[int, float]] = []
        for name, scale in lora:
            adapter = self._by_name.get(name)
            if adapter is None:
                raise ModelNotFoundError(
                    f"The model `{name}` does not exist or you do not have access to it "
                    "(no such LoRA adapter is loaded).",
                    param="model",
                )
            if scale != 0.0:
                key.append((adapter, float(scale)))
        return tuple(sorted(key))

    def apply(self, ctx: Any, key: LoraKey) -> None:
        """Make `ctx` decode under `key` (nothing to do when it already does)."""
        import llama_cpp

        address = _address(ctx)
        if self._active.get(address, ()) == key:
            return
        n = len(key)
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(self._pointers[a] for a, _ in key))
        scales = (ctypes.c_float * n)(*(s for _, s in key))
        rc = llama_cpp.llama_set_adapters_lora(ctx, adapters if n else None, n, scales if n else None)
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora returned {rc}")
        self._active[address] = key

    def free_retired(self, ctx: Any, in_use: Iterable[LoraKey] = ()) -> set[int]:
        """Free retired adapters that no running sequence decodes under (and take them off `ctx`
        first, which must not keep a freed adapter). Returns the freed addresses: a prompt cache
        keyed by them must forget those entries (the address may come back as another adapter)."""
        import llama_cpp

        if not self._retired:
            return set()
        freed: set[int] = set()
        busy = {adapter for key in in_use for adapter, _ in key}
        for adapter in list(self._retired - busy):
            if any(a == adapter for a, _ in self._active.get(_address(ctx), ())):
                self.apply(ctx, ())
            llama_cpp.llama_adapter_lora_free(self._pointers.pop(adapter))
            self._retired.discard(adapter)
            freed.add(adapter)
        return freed


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0
