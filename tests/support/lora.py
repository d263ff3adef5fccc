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


def assert_each_got_its_own(
    jobs: list[tuple[str | None, str]], together: list[str], alone: list[str]
) -> None:
    """Requests sent at once each answered with their own adapter: each text follows the answer its
    (adapter, prompt) gave alone further than any other adapter's answer to that prompt does.

    Not `together == alone`: a batch's rows go through LoRA's matrix products in groups whose size
    depends on timing, and those kernels round differently for different row counts, so on a busy
    machine a greedy answer may leave the lone one late in the text; an adapter mixed up with
    another leaves it where the two adapters' answers part."""

    def shared(x: str, y: str) -> int:
        return next((k for k, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))

    for i, ((lora, prompt), text) in enumerate(zip(jobs, together, strict=True)):
        others = [alone[j] for j, (o, p) in enumerate(jobs) if p == prompt and o != lora]
        own = shared(text, alone[i])
        assert all(own > shared(text, other) for other in others), (lora, prompt, text, alone[i], others)
