"""The two LoRA adapters `examples/lora.yaml` and `examples/lora-vllm.yaml` serve, built once per
machine by models/build_lora_adapters.py (peft on SmolLM2's HF folder, converted with llama.cpp's
script), and the gateway the LoRA suite (tests/support/suites/lora.py) talks to."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[2] / "models" / "build_lora_adapters.py"
# A prompt with many likely answers: a random adapter moves its greedy answer, where a question
# with one confident answer ("the capital of France") may keep it.
PROMPT = "Tell me a short story about a cat."
BASE, A, B = "smollm2-135m-instruct", "smollm2-lora-a", "smollm2-lora-b"
OTHER = "other-base-lora"  # a real adapter of another base model (a tiny Llama): to be refused


@dataclass(frozen=True)
class LoraGateway:
    """A gateway serving BASE with adapters A and B. `admin_key` None: its admin routes are open;
    `state_dir` None: it persists no registry."""

    url: str
    admin_key: str | None = None
    state_dir: Path | None = None

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}

    def curl_auth(self) -> list[str]:
        return [arg for k, v in self.auth().items() for arg in ("-H", f"{k}: {v}")]


def build_adapters() -> dict[str, Path]:
    """Name -> GGUF path of each adapter (OTHER included), as the builder prints them; it builds what is missing
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


def peft_folders(ggufs: dict[str, Path]) -> dict[str, Path]:
    """The PEFT folder (what vLLM loads) beside each GGUF the builder printed."""
    return {name: path.parent for name, path in ggufs.items()}


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
