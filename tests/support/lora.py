"""The two LoRA adapters `examples/lora.yaml` serves, built once per machine by
models/build_lora_adapters.py (peft on SmolLM2's HF folder, converted with llama.cpp's script)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[2] / "models" / "build_lora_adapters.py"
# A prompt with many likely answers: a random adapter moves its greedy answer, where a question
# with one confident answer ("the capital of France") may keep it.
PROMPT = "Tell me a short story about a cat."


def build_adapters() -> dict[str, Path]:
    """Name -> GGUF path of each adapter, as the builder prints them; it builds what is missing
    (a minute or two, once per machine) and answers at once after that."""
    done = subprocess.run(
        [sys.executable, str(BUILDER)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    pairs = (line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    return {name: Path(path) for name, path in pairs}
