"""`tiny-reasoner`, the reasoning model the reasoning tests serve: `models/build_reasoning_model.py`
builds it once per machine (the shipped SmolLM2 with `<think>` marker tokens and a Qwen3-style
template that opens the thinking); this runs the script (a cache hit prints the path at once)."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from tests.support.gateway import REPO

MODEL = "tiny-reasoner"
EOS = 2  # `<|im_end|>`, SmolLM2's end of turn (its tokenizer's EOS, and llama.cpp's)


def _build(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "models" / "build_reasoning_model.py"), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out.stdout.strip().splitlines()


@cache
def tiny_reasoner() -> str:
    """The GGUF's path, built if missing."""
    path = _build()[-1]
    assert Path(path).is_file()
    return path


@cache
def tiny_reasoner_hf() -> str:
    """The Hugging Face folder vLLM serves, built if missing (needs `make vllm-setup`)."""
    folder = _build("--hf")[-2]
    assert (Path(folder) / "config.json").is_file()
    return folder


def reasoner_spec(**kw: Any) -> dict[str, Any]:
    """A deployment of it, with no default budget (tests set their own per request)."""
    spec = {
        "name": MODEL,
        "source": {"path": tiny_reasoner()},
        "num_cpus": 0.25,
        "engine": {"n_ctx": 1024, "n_threads": 1},
        "reasoning": {"parser": "auto"},
    }
    return {**spec, **kw}


# `tiny-harmony`: the same weights with gpt-oss's harmony tokens and a gpt-oss style template
# (`models/build_reasoning_model.py --harmony`).
HARMONY_MODEL = "tiny-harmony"
# `<|end|><|start|>assistant<|channel|>final<|message|>`: the tokens a spent budget forces.
HARMONY_END_TOKENS = 7


@cache
def tiny_harmony() -> str:
    path = _build("--harmony")[-1]
    assert Path(path).is_file()
    return path


@cache
def tiny_harmony_hf() -> str:
    folder = _build("--harmony", "--hf")[-2]
    assert (Path(folder) / "config.json").is_file()
    return folder


def harmony_spec(**kw: Any) -> dict[str, Any]:
    """A deployment of `tiny-harmony`, its parser auto-detected from the template's `<|channel|>`."""
    return reasoner_spec(**{"name": HARMONY_MODEL, "source": {"path": tiny_harmony()}, **kw})
