"""The Files and Batch APIs through the `openai` SDK: a chat and an embeddings batch complete with
every `custom_id` once and bodies shaped like the interactive endpoint's, bad lines are refused at
upload naming the line, files round-trip, a cancelled batch keeps what finished. Engine-agnostic:
tests/e2e/test_batches.py runs it on llama.cpp, tests/e2e/vllm/test_vllm_batches.py on vLLM."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types import Batch

from tests.support.models import CHAT_MODEL, EMBED_MODEL
from tests.support.openapi import validate

FINAL = ("completed", "failed", "expired", "cancelled")
# A batch runs behind interactive traffic on a shared, loaded machine: generous.
BATCH_TIMEOUT_S = 240


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def line(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat_line(custom_id: str, text: str, max_tokens: int = 8, model: str = CHAT_MODEL) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    return line(custom_id, "/v1/chat/completions", {**body, "temperature": 0})


def upload(client: openai.OpenAI, lines: list[dict[str, Any]], name: str = "batch.jsonl") -> str:
    f = client.files.create(file=(name, io.BytesIO(jsonl(lines))), purpose="batch")
    assert f.purpose == "batch" and f.object == "file" and f.bytes == len(jsonl(lines))
    return f.id


def submit(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str, **kw: Any) -> Batch:
    file_id = upload(client, lines)
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        **kw,
    )
    assert batch.input_file_id == file_id and batch.endpoint == endpoint
    assert batch.status in ("validating", "in_progress", "completed"), batch
    return batch


def wait_final(client: openai.OpenAI, batch_id: str, timeout: float = BATCH_TIMEOUT_S) -> Batch:
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in FINAL:
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.5)
    return batch


def results(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """An output or error file by custom_id; each custom_id once."""
    if file_id is None:
        return {}
    rows = [json.loads(r) for r in client.files.content(file_id).text.splitlines() if r]
    by_id = {r["custom_id"]: r for r in rows}
    assert len(by_id) == len(rows), "a custom_id appears twice"
    return by_id


def test_chat_batch_completes_with_interactive_shaped_bodies(client: openai.OpenAI, base_url: str) -> None:
    lines = [chat_line(f"q-{i}", f"Say the number {i}.") for i in range(3)]
    lines.append(chat_line("no-such-model", "hi", model="no-such-model"))
    batch = submit(client, lines, "/v1/chat/completions", metadata={"job": "suite"})
    assert batch.metadata == {"job": "suite"}
    done = wait_final(client, batch.id)
    assert done.status == "completed", done
    # OpenAI answers unset fields as null (its own examples do); its schema lists them as plain
    # strings and objects, so the schema check reads the body without them.
    raw = httpx.get(f"{base_url}/batches/{batch.id}", timeout=30).json()
    assert raw["errors"] is None and raw["failed_at"] is None
    validate({k: v for k, v in raw.items() if v is not None}, "Batch")
    validate(httpx.get(f"{base_url}/files/{batch.input_file_id}", timeout=30).json(), "OpenAIFile")
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 3, 1)
    assert done.completed_at is not None and done.created_at <= done.completed_at

    outputs = results(client, done.output_file_id)
    assert set(outputs) == {"q-0", "q-1", "q-2"}
    interactive = httpx.post(f"{base_url}/chat/completions", json=lines[0]["body"], timeout=120).json()
    for row in outputs.values():
        assert row["error"] is None and row["id"].startswith("batch_req_")
        response = row["response"]
        assert response["status_code"] == 200 and response["request_id"]
        body = response["body"]
        assert set(body) == set(interactive)
        assert body["object"] == "chat.completion" and body["model"] == interactive["model"]
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert 0 < body["usage"]["completion_tokens"] <= 8
    errors = results(client, done.error_file_id)
    assert set(errors) == {"no-such-model"}
    failed = errors["no-such-model"]["response"]
    assert failed["status_code"] == 404 and failed["body"]["error"]["code"] == "model_not_found"


def test_embeddings_batch(client: openai.OpenAI, base_url: str) -> None:
    texts = {"cat": "A cat sits on the mat.", "stocks": ["Markets fell.", "Bonds rose."]}
    lines = [line(k, "/v1/embeddings", {"model": EMBED_MODEL, "input": v}) for k, v in texts.items()]
    done = wait_final(client, submit(client, lines, "/v1/embeddings").id)
    assert done.status == "completed" and done.error_file_id is None, done
    outputs = results(client, done.output_file_id)
    assert set(outputs) == set(texts)
    interactive = httpx.post(f"{base_url}/embeddings", json=lines[0]["body"], timeout=120).json()
    for key, row in outputs.items():
        body = row["response"]["body"]
        assert set(body) == set(interactive)
        assert len(body["data"]) == (1 if isinstance(texts[key], str) else 2)
        assert all(len(d["embedding"]) == len(interactive["data"][0]["embedding"]) for d in body["data"])
    # A float vector in a batch is the interactive one (the same engine call).
    cat = outputs["cat"]["response"]["body"]["data"][0]["embedding"]
    assert cat == pytest.approx(interactive["data"][0]["embedding"], abs=1e-5)


def test_bad_files_are_refused_naming_the_line(client: openai.OpenAI) -> None:
    good = chat_line("a", "hi")
    cases = {
        "not json": (jsonl([good]) + b"{not json\n", "line 2"),
        "no custom_id": (jsonl([good, {k: v for k, v in good.items() if k != "custom_id"}]), "line 2"),
        "duplicate": (jsonl([good, good]), "line 2"),
        "wrong method": (jsonl([good, good | {"custom_id": "b", "method": "GET"}]), "line 2"),
        "unknown url": (jsonl([good | {"url": "/v1/images/generations"}]), "line 1"),
    }
    for what, (content, named) in cases.items():
        with pytest.raises(openai.BadRequestError) as info:
            client.files.create(file=("bad.jsonl", io.BytesIO(content)), purpose="batch")
        assert info.value.status_code == 400, what
        assert named in info.value.message, (what, info.value.message)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("empty.jsonl", io.BytesIO(b"")), purpose="batch")
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("x.jsonl", io.BytesIO(jsonl([good]))), purpose="fine-tune")
    assert info.value.param == "purpose"


def test_files_round_trip_and_batch_errors(client: openai.OpenAI) -> None:
    content = jsonl([chat_line("a", "hi")])
    file_id = upload(client, [chat_line("a", "hi")], name="round.jsonl")
    found = client.files.retrieve(file_id)
    assert (found.filename, found.bytes, found.purpose) == ("round.jsonl", len(content), "batch")
    assert client.files.content(file_id).content == content
    assert file_id in {f.id for f in client.files.list(purpose="batch")}
    # A batch over an endpoint its lines do not name fails validation, naming the lines.
    mismatched = client.batches.create(
        input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
    )
    assert mismatched.status == "failed" and mismatched.errors is not None and mismatched.errors.data
    assert mismatched.errors.data[0].line == 1 and mismatched.errors.data[0].code == "mismatched_url"
    deleted = client.files.delete(file_id)
    assert deleted.deleted and deleted.id == file_id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(file_id)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nonexistent")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]
        )


def test_cancel_keeps_what_finished_and_lists_page(client: openai.OpenAI) -> None:
    lines = [
        chat_line(f"c-{i}", f"Write a long story about the number {i}.", max_tokens=48) for i in range(24)
    ]
    batch = submit(client, lines, "/v1/chat/completions")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
    done = wait_final(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None, done
    assert done.request_counts is not None and done.request_counts.completed < 24
    outputs = results(client, done.output_file_id)
    assert len(outputs) == done.request_counts.completed and set(outputs) <= {f"c-{i}" for i in range(24)}
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(_finished(client))

    # Newest first, paged with `after`.
    newest = client.batches.list(limit=1)
    assert len(newest.data) == 1 and newest.has_more
    second = client.batches.list(limit=1, after=newest.data[0].id)
    assert second.data and second.data[0].id != newest.data[0].id
    assert second.data[0].created_at <= newest.data[0].created_at


def _finished(client: openai.OpenAI) -> str:
    done = wait_final(client, submit(client, [chat_line("x", "hi", max_tokens=2)], "/v1/chat/completions").id)
    assert done.status == "completed"
    return done.id
