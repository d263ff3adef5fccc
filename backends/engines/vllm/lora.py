"""LoRA adapters on one vLLM engine, by name (docs/lora.md).

vLLM identifies an adapter by a `LoRARequest` (name, a positive integer id unique for the engine's
life, the PEFT folder) passed with each request. `add_lora` reads and checks the folder at once,
so a bad adapter is refused when it is loaded rather than on its first request. vLLM itself keeps
at most `max_cpu_loras` adapters in memory (default `max_loras`) and `max_loras` in one batch: an
adapter evicted from its least-recently-used cache is read again from its folder when a request
names it, so any number of adapters may be registered here.

`add_lora` does not check that the adapter was made for this model, though: it copies each LoRA
matrix into the top-left corner of buffers sized for the base, so an adapter of a smaller base
loads and then computes nonsense. `check_base` compares the adapter's tensor shapes (read from the
safetensors header) with the base model's config first and refuses a mismatch by name.

Unloading takes the name away at once (later requests are refused) but removes it from the engine
only when the requests still running under it have finished: `remove_lora` under a running request
would make vLLM read the folder again for its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import struct
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
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
        await asyncio.to_thread(check_base, name, Path(path), llm.model_config.hf_text_config)
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


# `...layers.N.self_attn.q_proj.lora_A.weight` and the like: the projections of a Llama-style
# decoder layer, whose shapes follow from the config (experts' projections are not matched).
_TENSOR = re.compile(r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.lora_([AB])\.weight$")


def base_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """Projection name -> (inputs, outputs) in the base model a Hugging Face `config` describes;
    only what the config determines."""
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0:
        return {}
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    shapes = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv * head_dim),
        "v_proj": (hidden, kv * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
    inter = getattr(config, "intermediate_size", None)
    if isinstance(inter, int):
        shapes |= {"gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    return shapes


def check_base(name: str, folder: Path, config: Any) -> None:
    """400 naming the adapter when its LoRA matrices do not fit the base model's layers (an
    adapter of another base); what cannot be told from the folder is left to vLLM."""
    header = _safetensors_header(folder / "adapter_model.safetensors")
    shapes = base_shapes(config)
    layers = getattr(config, "num_hidden_layers", None)
    for tensor, meta in header.items():
        match = _TENSOR.search(tensor)
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if match is None or not isinstance(shape, list) or len(shape) != 2:
            continue
        layer, proj, side = int(match[1]), match[2], match[3]
        if isinstance(layers, int) and layer >= layers:
            problem = f"it has a layer {layer}, this model {layers} layers"
        elif proj in shapes:
            expected = shapes[proj][0] if side == "A" else shapes[proj][1]
            got = shape[1] if side == "A" else shape[0]
            if got == expected:
                continue
            what = "inputs" if side == "A" else "outputs"
            problem = f"its {proj} has {got} {what}, this model's {expected}"
        else:
            continue
        raise BadRequestError(
            f"LoRA adapter `{name}` was made for another base model ({problem}).", param="lora_path"
        )


def _safetensors_header(file: Path) -> dict[str, Any]:
    """The tensor table at the head of a safetensors file ({} when there is none to read)."""
    try:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size)) if 0 < size < 1 << 26 else {}
    except (OSError, struct.error, ValueError):
        return {}
    return header if isinstance(header, dict) else {}


async def _remove(llm: Any, adapter: int) -> None:
    # The engine may be gone or restarting: a rebuilt engine has no adapter to remove.
    with contextlib.suppress(Exception):
        await llm.remove_lora(adapter)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]
