"""LoRA adapters on one vLLM engine, by name (docs/lora.md).

vLLM identifies an adapter by a `LoRARequest` (name, a positive integer id unique for the engine's
life, the PEFT folder) passed with each request. `add_lora` reads and checks the folder at once,
so a bad adapter is refused when it is loaded rather than on its first request. vLLM itself keeps
at most `max_cpu_loras` adapters in memory (default `max_loras`) and `max_loras` in one batch: an
adapter evicted from its least-recently-used cache is read again from its folder when a request
names it, so any number of adapters may be registered here.

Unloading takes the name away at once (later requests are refused) but removes it from the engine
only when the requests still running under it have finished: `remove_lora` under a running request
would make vLLM read the folder again for its next step.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from raygate.protocol.errors import BadRequestError, ModelNotFoundError


class VllmAdapters:
    """The adapters one AsyncLLM serves: name -> `LoRARequest`, and what still runs under each."""

    def __init__(self) -> None:
        self._by_name: dict[str, Any] = {}
        self._next_id = 1  # vLLM's ids start at 1; never reused, so a reloaded name is a new adapter
        self._running: Counter[int] = Counter()
        self._retired: set[int] = set()

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    async def load(self, llm: Any, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        if name in self._by_name:
            raise BadRequestError(f"LoRA adapter `{name}` is already loaded.", param="lora_name")
        request = LoRARequest(lora_name=name, lora_int_id=self._next_id, lora_path=path)
        self._next_id += 1
        try:
            await llm.add_lora(request)
        except Exception as exc:  # vLLM raises ValueError / RuntimeError / its own errors by case
            raise BadRequestError(
                f"LoRA adapter `{name}`: vLLM could not load {path} (a PEFT adapter folder for this "
                f"model is needed): {_first_line(exc)}",
                param="lora_path",
            ) from None
        self._by_name[name] = request

    async def unload(self, llm: Any, name: str) -> None:
        request = self._by_name.pop(name, None)
        if request is None:
            raise ModelNotFoundError(f"LoRA adapter `{name}` is not loaded.", param="lora_name")
        if self._running[request.lora_int_id]:
            self._retired.add(request.lora_int_id)  # removed when its last request ends
        else:
            await _remove(llm, request.lora_int_id)

    def request(self, lora: tuple[tuple[str, float], ...]) -> Any:
        """The `LoRARequest` for a request's adapter set (None: the base model); 404 for an
        adapter that is not loaded, 400 for what vLLM cannot do (several adapters, a scale)."""
        if not lora:
            return None
        if len(lora) > 1:
            raise BadRequestError("vLLM applies one LoRA adapter per request.", param="lora")
        name, scale = lora[0]
        request = self._by_name.get(name)
        if request is None:
            raise ModelNotFoundError(
                f"The model `{name}` does not exist or you do not have access to it "
                "(no such LoRA adapter is loaded).",
                param="model",
            )
        if scale != 1.0:
            raise BadRequestError(
                f"LoRA adapter `{name}`: vLLM applies an adapter at scale 1.0 only (got {scale}).",
                param="lora",
            )
        return request

    @contextlib.asynccontextmanager
    async def using(self, llm: Any, request: Any) -> AsyncIterator[None]:
        """Count a request running under `request` (None: nothing to count), and remove a retired
        adapter from the engine when its last request ends."""
        if request is None:
            yield
            return
        adapter = request.lora_int_id
        self._running[adapter] += 1
        try:
            yield
        finally:
            self._running[adapter] -= 1
            if not self._running[adapter]:
                del self._running[adapter]
                if adapter in self._retired:
                    self._retired.discard(adapter)
                    await _remove(llm, adapter)


async def _remove(llm: Any, adapter: int) -> None:
    # The engine may be gone or restarting: a rebuilt engine has no adapter to remove.
    with contextlib.suppress(Exception):
        await llm.remove_lora(adapter)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]
