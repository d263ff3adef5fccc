"""The two LoRA adapters `examples/lora.yaml` serves, built once per machine by
models/build_lora_adapters.py (peft on SmolLM2's HF folder, converted with llama.cpp's script)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "models" / "build_lora_adapters.py"
ADAPTERS = ("smollm2-lora-a", "smollm2-lora-b")
FORMAT_VERSION = 1  # models/build_lora_adapters.py's
# A prompt with many likely answers: a random adapter moves its greedy answer, where a question
# with one confident answer ("the capital of France") may keep it.
PROMPT = "Tell me a short story about a cat."


def adapter_gguf(name: str) -> Path:
    return Path(f"~/.cache/raygate/models/{name}-v{FORMAT_VERSION}/{name}.gguf").expanduser()


def build_adapters() -> dict[str, Path]:
    """Name -> GGUF path of each adapter, building what is missing (a minute or two, once)."""
    if not all(adapter_gguf(name).is_file() for name in ADAPTERS):
        subprocess.run([sys.executable, str(BUILDER)], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return {name: adapter_gguf(name) for name in ADAPTERS}
