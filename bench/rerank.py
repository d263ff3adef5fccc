"""Rerank throughput on the full gateway (L2): documents/s for one request of 100 documents of
about 100 tokens each, against the embedding model (cosine) and the tiny cross-encoder GGUF
(llama.cpp rank pooling) when `models/build_rerank_models.py` has built it.

The models are deployed through `/admin` for the run and removed afterwards, as an operator
would, so the bench config and its other targets stay as they are. Part of `python -m bench`
(`--only rerank` runs it alone).
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench import servers

log = logging.getLogger("bench")

DOCUMENTS = 100
ROUNDS = 3
MINILM = servers.REPO / "models" / "all-minilm-l6-v2.Q8_0.gguf"
TINY_RERANKER = Path("~/.cache/raygate/models/tiny-bert-reranker-v2.f32.gguf").expanduser()
# models/default.yaml's settings for the embedding model: what `make serve` gives.
ENGINE = {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512, "n_threads": 1}
# ~100 WordPiece tokens each (20 sentences of 5 common words), all different: the cosine path
# embeds each distinct text once, so repeated documents would be counted (and timed) once.
WORDS = ["river", "mountain", "city", "music", "science", "garden", "ocean", "market", "history", "window"]


def documents() -> list[str]:
    def sentence(i: int, j: int) -> str:
        return f"{WORDS[(i + j) % 10]} {WORDS[(i // 10 + 3 * j) % 10]} near the {WORDS[j % 10]}."

    return [" ".join(sentence(i, j) for j in range(20)) for i in range(DOCUMENTS)]


def _specs() -> list[dict[str, Any]]:
    specs = [{"name": "bench-rerank-minilm", "task": "embed", "source": {"path": str(MINILM)}}]
    if TINY_RERANKER.is_file():
        specs.append({"name": "bench-rerank-cross", "task": "rerank", "source": {"path": str(TINY_RERANKER)}})
    else:
        log.info("no %s (run models/build_rerank_models.py): cross-encoder row skipped", TINY_RERANKER)
    # No CPU reservation: the L2 gateway's own models hold all of its Ray CPUs (a reserving spec
    # waited for ever in `loading`), and they are idle while this row runs.
    return [{**s, "num_cpus": 0, "engine": ENGINE} for s in specs]


def _wait_ready(http: httpx.Client, name: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = http.get(f"/admin/deployments/{name}").json()
        if status["state"] == "ready" and not status["updating"]:
            return
        if status["state"] == "failed":
            raise RuntimeError(status["error"])
        time.sleep(0.2)
    raise TimeoutError(f"{name} did not become ready")


def measure(url: str) -> list[dict[str, Any]]:
    """One row per model: documents/s (the median of ROUNDS requests, after one warm-up)."""
    docs, rows = documents(), []
    with httpx.Client(base_url=url, timeout=600) as http:
        for spec in _specs():
            name = spec["name"]
            r = http.post("/admin/deployments", json=spec)
            r.raise_for_status()
            try:
                _wait_ready(http, name)
                body = {
                    "model": name,
                    "query": "Which document is about the ocean near the city?",
                    "documents": docs,
                }
                seconds, tokens = [], 0
                for i in range(ROUNDS + 1):
                    t0 = time.perf_counter()
                    r = http.post("/v1/rerank", json=body)
                    r.raise_for_status()
                    if i:  # the first one warms up
                        seconds.append(time.perf_counter() - t0)
                    tokens = r.json()["usage"]["prompt_tokens"]
                median = statistics.median(seconds)
                rows.append(
                    {
                        "model": name,
                        "task": spec["task"],
                        "documents": DOCUMENTS,
                        "tokens_per_document": round(tokens / DOCUMENTS),
                        "seconds_p50": median,
                        "documents_per_s": DOCUMENTS / median,
                    }
                )
                log.info("rerank %s: %.1f documents/s", name, DOCUMENTS / median)
            finally:
                http.delete(f"/admin/deployments/{name}")
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| rerank (L2) | model kind | documents x tokens | p50 s | documents/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['model']} | {r['task']} | {r['documents']} x ~{r['tokens_per_document']} "
        f"| {r['seconds_p50']:.2f} | {r['documents_per_s']:.1f} |"
        for r in rows
    ]
    return "\n".join(lines)
