"""Embeddings: input forms, encodings, normalisation, and that the vectors mean something."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.support.models import EMBED_MODEL
from tests.support.openapi import validate


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_float_response_shape(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/embeddings",
        json={"model": EMBED_MODEL, "input": "hello world", "encoding_format": "float"},
        timeout=60,
    )
    assert r.status_code == 200
    body = r.json()
    validate(body, "CreateEmbeddingResponse")
    vec = body["data"][0]["embedding"]
    assert len(vec) == 384
    assert math.isclose(math.sqrt(sum(v * v for v in vec)), 1.0, rel_tol=1e-4)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def test_sdk_default_base64_batch_and_meaning(client: openai.OpenAI) -> None:
    """The openai SDK asks for base64 unless told otherwise, and decodes it itself."""
    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock markets fell sharply today."]
    out = client.embeddings.create(model=EMBED_MODEL, input=texts)
    vecs = [d.embedding for d in out.data]
    assert [d.index for d in out.data] == [0, 1, 2]
    assert all(len(v) == 384 for v in vecs)
    assert cosine(vecs[0], vecs[1]) > cosine(vecs[0], vecs[2]) + 0.2
    floats = client.embeddings.create(model=EMBED_MODEL, input=texts, encoding_format="float")
    for a, b in zip(vecs, (d.embedding for d in floats.data), strict=True):
        assert cosine(a, b) == pytest.approx(1.0, abs=1e-5)


def test_token_id_input(client: openai.OpenAI) -> None:
    # BERT WordPiece ids: [CLS]=101, "hello"=7592, "world"=2088, [SEP]=102.
    by_ids = client.embeddings.create(
        model=EMBED_MODEL, input=[101, 7592, 2088, 102], encoding_format="float"
    )
    by_text = client.embeddings.create(model=EMBED_MODEL, input="hello world", encoding_format="float")
    assert by_ids.usage.prompt_tokens == 4
    assert cosine(by_ids.data[0].embedding, by_text.data[0].embedding) == pytest.approx(1.0, abs=1e-4)


def test_dimensions_truncate_and_renormalise(client: openai.OpenAI) -> None:
    out = client.embeddings.create(model=EMBED_MODEL, input="hello", dimensions=64, encoding_format="float")
    vec = out.data[0].embedding
    assert len(vec) == 64
    assert math.isclose(math.sqrt(sum(v * v for v in vec)), 1.0, rel_tol=1e-4)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=EMBED_MODEL, input="hello", dimensions=1000)
    assert err.value.body["param"] == "dimensions"  # type: ignore[index]
