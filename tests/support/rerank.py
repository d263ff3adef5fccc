"""The tiny cross-encoder the rerank tests serve, and transformers' scores to hold engines to.

`models/build_rerank_models.py` builds it once per machine (a random-weight
`BertForSequenceClassification`, its GGUF by llama.cpp's converter) under ~/.cache/raygate; this
runs the script (a cache hit prints the paths at once) and computes the reference logits with
transformers in the test process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

from tests.support.gateway import REPO

# llama.cpp (f32 GGUF) and vLLM (fp32 on CPU) against transformers' fp32 logits: the tiny model's
# logits spread over about +-3, so this tolerance still tells every document apart.
LOGIT_TOLERANCE = 0.02


@cache
def tiny_reranker() -> dict[str, str]:
    """`{"hf": folder, "gguf": file}` of the tiny cross-encoder, built if missing."""
    out = subprocess.run(
        [sys.executable, str(REPO / "models" / "build_rerank_models.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    paths: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(paths["gguf"]).is_file() and (Path(paths["hf"]) / "config.json").is_file()
    return paths


def reference_logits(query: str, documents: list[str]) -> list[float]:
    """transformers' logit for each (query, document) pair: what both engines must reproduce."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tiny_reranker()["hf"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        enc = tokenizer([query] * len(documents), documents, padding=True, return_tensors="pt")
        return [float(x) for x in model(**enc).logits[:, 0]]


def reranker_spec(name: str, **kw: object) -> dict[str, object]:
    """The tiny cross-encoder on llama.cpp, as an operator deploys it through `/admin`."""
    spec = {
        "name": name,
        "task": "rerank",
        "source": {"path": tiny_reranker()["gguf"]},
        "num_cpus": 0.25,
        "engine": {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512, "n_threads": 1},
    }
    return {**spec, **kw}
