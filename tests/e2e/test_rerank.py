"""Rerank and score (`/v1/rerank`, `/rerank`, `/v2/rerank`, `/v1/score`): the embedding model by
cosine similarity, a cross-encoder GGUF on llama.cpp held to transformers' logits, the clients
people point at them (Cohere's SDK, curl; Xinference's client is in test_xinference.py), and the
refusals."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from typing import Any

import cohere
import httpx
import pytest

from tests.support.admin import settled_ready, wait_deployment
from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.ops import wait_for
from tests.support.rerank import LOGIT_TOLERANCE, reference_logits, reranker_spec

RERANKER = "tiny-reranker"
RERANKER_MAX_DOCUMENTS = 4

QUERY = "What is the capital of France?"
DOCS = [
    "The stock market fell sharply today.",
    "Paris is the capital and largest city of France.",
    "Bananas are a yellow tropical fruit.",
]
BEST = 1  # DOCS[1] answers QUERY; the other two are about something else entirely


@pytest.fixture(scope="module")
def reranker(default_gateway: GatewayProcess) -> Iterator[str]:
    """The tiny cross-encoder deployed through /admin with `task: rerank`, as an operator would."""
    url = default_gateway.url
    spec = reranker_spec(RERANKER, limits={"max_documents": RERANKER_MAX_DOCUMENTS})
    r = httpx.post(f"{url}/admin/deployments", json=spec, timeout=30)
    assert r.status_code in (200, 201, 202), r.text
    wait_deployment(url, RERANKER, settled_ready(1), timeout=180)
    yield RERANKER
    httpx.delete(f"{url}/admin/deployments/{RERANKER}", timeout=60)


def post(gateway: GatewayProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, timeout=120)


def test_embedding_model_reranks_by_cosine(default_gateway: GatewayProcess) -> None:
    r = post(default_gateway, "/v1/rerank", {"model": EMBED_MODEL, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    results = body["results"]
    assert results[0]["index"] == BEST
    assert sorted(x["index"] for x in results) == [0, 1, 2]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 for s in scores)
    assert scores[0] > scores[1] + 0.2
    assert [x["document"]["text"] for x in results] == [DOCS[x["index"]] for x in results]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert body["model"] == EMBED_MODEL and body["meta"]["billed_units"]["search_units"] == 1


def test_paths_top_n_and_documents_as_objects(default_gateway: GatewayProcess) -> None:
    full = post(
        default_gateway, "/v1/rerank", {"model": EMBED_MODEL, "query": QUERY, "documents": DOCS}
    ).json()
    for path in ("/rerank", "/v2/rerank"):
        body = {
            "model": EMBED_MODEL,
            "query": QUERY,
            "documents": [{"text": d} for d in DOCS],
            "top_n": 2,
            "return_documents": False,
        }
        r = post(default_gateway, path, body)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == [x["index"] for x in full["results"][:2]]
        assert all(set(x) == {"index", "relevance_score"} for x in results)
        for got, want in zip(results, full["results"], strict=False):
            assert got["relevance_score"] == pytest.approx(want["relevance_score"], abs=1e-5)


def test_score_pairings(default_gateway: GatewayProcess) -> None:
    one_to_n = post(default_gateway, "/v1/score", {"model": EMBED_MODEL, "text_1": QUERY, "text_2": DOCS})
    assert one_to_n.status_code == 200, one_to_n.text
    body = one_to_n.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2]
    scores = [d["score"] for d in body["data"]]
    assert max(range(3), key=lambda i: scores[i]) == BEST
    n_to_n = post(
        default_gateway, "/v1/score", {"model": EMBED_MODEL, "text_1": [QUERY, DOCS[2]], "text_2": DOCS[1:]}
    ).json()
    assert [d["score"] for d in n_to_n["data"]] == pytest.approx([scores[1], 1.0], abs=1e-4)
    one = post(
        default_gateway, "/v1/score", {"model": EMBED_MODEL, "text_1": QUERY, "text_2": DOCS[1]}
    ).json()
    assert len(one["data"]) == 1 and one["data"][0]["score"] == pytest.approx(scores[1], abs=1e-5)


def test_cross_encoder_on_llama_cpp_matches_transformers(
    default_gateway: GatewayProcess, reranker: str
) -> None:
    want = reference_logits(QUERY, DOCS)
    assert max(want) - min(want) > 20 * LOGIT_TOLERANCE  # the comparison below tells documents apart
    raw = post(
        default_gateway,
        "/v1/score",
        {"model": reranker, "text_1": QUERY, "text_2": DOCS, "use_activation": False},
    )
    assert raw.status_code == 200, raw.text
    assert [d["score"] for d in raw.json()["data"]] == pytest.approx(want, abs=LOGIT_TOLERANCE)
    ranked = post(
        default_gateway, "/v1/rerank", {"model": reranker, "query": QUERY, "documents": DOCS}
    ).json()
    order = sorted(range(3), key=lambda i: -want[i])
    assert [x["index"] for x in ranked["results"]] == order
    sigmoid = [1 / (1 + math.exp(-want[i])) for i in order]
    assert [x["relevance_score"] for x in ranked["results"]] == pytest.approx(
        sigmoid, abs=LOGIT_TOLERANCE / 4
    )
    card = httpx.get(f"{default_gateway.url}/v1/models/{reranker}", timeout=30).json()
    assert card["task"] == "rerank"
    listed = {
        m["id"]: m["task"] for m in httpx.get(f"{default_gateway.url}/v1/models", timeout=30).json()["data"]
    }
    assert (
        listed[EMBED_MODEL] == "embed" and listed[CHAT_MODEL] == "generate" and listed[reranker] == "rerank"
    )


def test_cohere_sdk_v1_and_v2(default_gateway: GatewayProcess) -> None:
    with httpx.Client(timeout=120) as http:  # the SDK leaves its own client open
        v2 = cohere.ClientV2(api_key="unused", base_url=default_gateway.url, httpx_client=http)
        out2 = v2.rerank(model=EMBED_MODEL, query=QUERY, documents=DOCS, top_n=2)
        assert len(out2.results) == 2 and out2.results[0].index == BEST
        assert out2.results[0].relevance_score > out2.results[1].relevance_score
        v1 = cohere.Client(api_key="unused", base_url=default_gateway.url, httpx_client=http)
        out1 = v1.rerank(model=EMBED_MODEL, query=QUERY, documents=DOCS, return_documents=True)
        assert out1.results[0].index == BEST
        assert out1.results[0].document is not None and out1.results[0].document.text == DOCS[BEST]


def test_curl(default_gateway: GatewayProcess) -> None:
    body = json.dumps({"model": EMBED_MODEL, "query": QUERY, "documents": DOCS, "top_n": 1})
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-f",
            f"{default_gateway.url}/v1/rerank",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout)["results"][0]["index"] == BEST


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rerank", {"model": EMBED_MODEL, "query": QUERY, "documents": []}, "documents"),
        ("/v1/rerank", {"model": EMBED_MODEL, "query": "", "documents": DOCS}, "query"),
        ("/v1/rerank", {"model": EMBED_MODEL, "query": QUERY, "documents": ["a", " "]}, "documents"),
        ("/v1/rerank", {"model": EMBED_MODEL, "query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
        ("/v1/rerank", {"model": EMBED_MODEL, "query": QUERY, "documents": ["x"] * 1001}, "documents"),
        ("/v1/rerank", {"model": CHAT_MODEL, "query": QUERY, "documents": DOCS}, "model"),
        ("/v1/score", {"model": EMBED_MODEL, "text_1": [QUERY, QUERY], "text_2": DOCS}, None),
        ("/v1/score", {"model": EMBED_MODEL, "text_1": QUERY, "text_2": []}, "text_2"),
        ("/v1/score", {"model": EMBED_MODEL, "text_1": QUERY, "text_2": ["x"] * 1001}, "text_2"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    default_gateway: GatewayProcess, path: str, body: dict[str, Any], param: str | None
) -> None:
    r = post(default_gateway, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if body["model"] == CHAT_MODEL:
        assert "rerank" in error["message"] and "chat" in error["message"]
    if len(body.get("documents", body.get("text_2", []))) == 1001:
        assert "1000" in error["message"]


def test_configured_limit_unknown_model_and_long_documents(
    default_gateway: GatewayProcess, reranker: str
) -> None:
    over = post(default_gateway, "/v1/rerank", {"model": reranker, "query": QUERY, "documents": ["x"] * 5})
    assert over.status_code == 400 and over.json()["error"]["param"] == "documents"
    assert str(RERANKER_MAX_DOCUMENTS) in over.json()["error"]["message"]
    missing = post(
        default_gateway, "/v1/rerank", {"model": "no-such-model", "query": QUERY, "documents": DOCS}
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    long_doc = "word " * 600  # past the 512-token context of both models
    for model in (EMBED_MODEL, reranker):
        r = post(
            default_gateway, "/v1/rerank", {"model": model, "query": QUERY, "documents": [DOCS[0], long_doc]}
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "documents"
    r = post(default_gateway, "/v1/score", {"model": reranker, "text_1": QUERY, "text_2": long_doc})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text_2"
    # Nothing was lost: the models still answer.
    ok = post(default_gateway, "/v1/rerank", {"model": reranker, "query": QUERY, "documents": DOCS[:2]})
    assert ok.status_code == 200, ok.text


def test_metrics_count_rerank(default_gateway: GatewayProcess) -> None:
    def successes() -> float:
        text = httpx.get(f"{default_gateway.url}/metrics", timeout=30).text
        prefix = f'raygate:request_success_total{{finished_reason="stop",model_name="{EMBED_MODEL}"}}'
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))

    before = successes()
    assert (
        post(
            default_gateway, "/v1/score", {"model": EMBED_MODEL, "text_1": QUERY, "text_2": DOCS[1]}
        ).status_code
        == 200
    )
    wait_for(lambda: successes() >= before + 1, timeout=10, what="the request's count")
    assert successes() == before + 1
