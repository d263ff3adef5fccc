"""`/v1/models` list and retrieve, and `/health`."""

from __future__ import annotations

import httpx
import openai

from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.openapi import validate


def test_list_models(client: openai.OpenAI, base_url: str) -> None:
    body = httpx.get(f"{base_url}/models").json()
    validate(body, "ListModelsResponse")
    ids = {m.id for m in client.models.list()}
    assert {CHAT_MODEL, EMBED_MODEL, "smollm2"} <= ids


def test_retrieve_model(client: openai.OpenAI, base_url: str) -> None:
    model = client.models.retrieve(CHAT_MODEL)
    assert model.id == CHAT_MODEL and model.object == "model" and model.owned_by
    validate(httpx.get(f"{base_url}/models/{EMBED_MODEL}").json(), "Model")


def test_health(gateway: object, base_url: str) -> None:
    r = httpx.get(base_url.removesuffix("/v1") + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
