"""Client mistakes get OpenAI-shaped 4xx errors (never a 500 or a hang), and the next request works."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.models import CHAT_MODEL, EMBED_MODEL

HELLO = [{"role": "user", "content": "hi"}]


def post(base_url: str, path: str, **kw: object) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", timeout=60, **kw)  # type: ignore[arg-type]


def assert_error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and len(r.content) < 4000
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    return err


def test_unknown_model_is_404_and_sdk_raises(client: openai.OpenAI, base_url: str) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=HELLO)  # type: ignore[arg-type]
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    err = assert_error(
        post(base_url, "/embeddings", json={"model": "nope", "input": "x"}), 404, "model_not_found"
    )
    assert "nope" in err["message"]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"model": CHAT_MODEL}, "messages"),
        ({"messages": HELLO}, "model"),
        ({"model": CHAT_MODEL, "messages": []}, "messages"),
        ({"model": CHAT_MODEL, "messages": "hi"}, "messages"),
        ({"model": CHAT_MODEL, "messages": HELLO, "temperature": 3}, "temperature"),
        ({"model": CHAT_MODEL, "messages": HELLO, "temperature": "hot"}, "temperature"),
        ({"model": CHAT_MODEL, "messages": HELLO, "max_tokens": -1}, "max_tokens"),
        ({"model": CHAT_MODEL, "messages": HELLO, "max_tokens": 0}, "max_tokens"),
        ({"model": CHAT_MODEL, "messages": HELLO, "top_p": 1.5}, "top_p"),
        ({"model": CHAT_MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"model": CHAT_MODEL, "messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_bad_chat_bodies_are_400(base_url: str, payload: dict, param: str) -> None:
    err = assert_error(post(base_url, "/chat/completions", json=payload), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'"text"', b""])
def test_malformed_bodies_are_400(base_url: str, content: bytes) -> None:
    r = post(base_url, "/chat/completions", content=content, headers={"content-type": "application/json"})
    assert_error(r, 400)


def test_huge_invalid_body_gets_bounded_error(base_url: str) -> None:
    messages = [{"role": "user", "content": 12345}] * 2000
    r = post(base_url, "/chat/completions", json={"model": CHAT_MODEL, "messages": messages})
    assert_error(r, 400)


def test_context_length_exceeded(client: openai.OpenAI, base_url: str) -> None:
    long = "hello " * 3000
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": long}])
    assert exc.value.code == "context_length_exceeded"
    assert "maximum context length is 2048 tokens" in exc.value.message
    r = post(base_url, "/completions", json={"model": CHAT_MODEL, "prompt": "hi", "max_tokens": 5000})
    assert_error(r, 400, "context_length_exceeded", "prompt")
    r = post(
        base_url,
        "/chat/completions",
        json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": long}], "stream": True},
    )
    assert_error(r, 400, "context_length_exceeded", "messages")
    ok = client.chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=3)  # type: ignore[arg-type]
    assert ok.choices[0].message.content is not None


def test_bad_embedding_inputs(base_url: str) -> None:
    for bad in ([], "", [[]], {"a": 1}):
        assert_error(
            post(base_url, "/embeddings", json={"model": EMBED_MODEL, "input": bad}), 400, param="input"
        )
    assert_error(
        post(base_url, "/embeddings", json={"model": EMBED_MODEL, "input": "x", "encoding_format": "hex"}),
        400,
        param="encoding_format",
    )
    assert_error(
        post(base_url, "/embeddings", json={"model": EMBED_MODEL, "input": [10**9]}), 400, param="input"
    )


def test_unknown_route_and_method(base_url: str) -> None:
    assert_error(httpx.get(f"{base_url}/nope"), 404)
    assert_error(httpx.get(f"{base_url}/chat/completions"), 405)


def test_unknown_fields_are_accepted(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=HELLO,
        max_tokens=3,
        extra_body={"some_future_field": {"x": 1}},  # type: ignore[arg-type]
    )
    assert out.choices[0].message.content is not None
