"""Rerank and score on vLLM: the tiny cross-encoder on vLLM's pooling runner (a classifier, with
the pair's token types) held to transformers' logits, and the vLLM-served embedding model ranking
by cosine similarity."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.admin import settled_ready, wait_deployment
from tests.support.models import EMBED_MODEL
from tests.support.rerank import LOGIT_TOLERANCE, reference_logits, tiny_reranker
from tests.support.vllm import CPU_ENV, VllmDeployment

RERANKER = "tiny-reranker-vllm"
QUERY = "What is the capital of France?"
DOCS = [
    "The stock market fell sharply today.",
    "Paris is the capital and largest city of France.",
    "Bananas are a yellow tropical fruit.",
]


@pytest.fixture(scope="module")
def vllm_reranker(vllm: VllmDeployment) -> Iterator[str]:
    url = vllm.process.url
    spec = {
        "name": RERANKER,
        "backend": "vllm",
        "task": "rerank",
        "source": {"path": tiny_reranker()["hf"]},
        "num_cpus": 0.5,
        # float32: vLLM on CPU would cast to half precision, transformers' reference is fp32.
        "engine": {"enforce_eager": True, "dtype": "float32"},
        "env": CPU_ENV,
    }
    r = httpx.post(f"{url}/admin/deployments", json=spec, timeout=30)
    assert r.status_code in (200, 201, 202), r.text
    wait_deployment(url, RERANKER, settled_ready(1), timeout=900)
    yield RERANKER
    httpx.delete(f"{url}/admin/deployments/{RERANKER}", timeout=120)


def test_cross_encoder_on_vllm_matches_transformers(vllm: VllmDeployment, vllm_reranker: str) -> None:
    want = reference_logits(QUERY, DOCS)
    r = httpx.post(
        f"{vllm.process.url}/v1/score",
        json={"model": vllm_reranker, "text_1": QUERY, "text_2": DOCS, "use_activation": False},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert [d["score"] for d in r.json()["data"]] == pytest.approx(want, abs=LOGIT_TOLERANCE)
    ranked = httpx.post(
        f"{vllm.process.url}/v2/rerank",
        json={"model": vllm_reranker, "query": QUERY, "documents": DOCS, "top_n": 2},
        timeout=300,
    ).json()
    assert [x["index"] for x in ranked["results"]] == sorted(range(3), key=lambda i: -want[i])[:2]
    assert all(0 < x["relevance_score"] < 1 for x in ranked["results"])


def test_vllm_embedding_model_reranks_by_cosine(vllm: VllmDeployment) -> None:
    r = httpx.post(
        f"{vllm.process.url}/v1/rerank",
        json={"model": EMBED_MODEL, "query": QUERY, "documents": DOCS},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results[0]["index"] == 1 and results[0]["relevance_score"] > results[1]["relevance_score"] + 0.2
