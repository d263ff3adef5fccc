"""Images in (docs/vision.md), through the real clients: what the API promises, on any engine.

Refusals for a text-only model run against the default text model; the rest take `vlm`, the name
of a deployed vision model, from the importing module. Nothing here asserts what a tiny model
wrote: images change the prompt's token count (by the same count for two images of one size),
two different images give different greedy answers, a repeated image hits the prompt cache.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from PIL import Image

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL


def png(color: tuple[int, int, int], size: tuple[int, int] = (64, 64), stripes: bool = False) -> bytes:
    image = Image.new("RGB", size, color)
    if stripes:
        for x in range(0, size[0], 8):
            for y in range(size[1]):
                image.putpixel((x, y), (255 - color[0], 255 - color[1], 255 - color[2]))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


RED = png((220, 20, 20))
BLUE = png((20, 40, 230), stripes=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{b64(data)}"


def chat_content(*images: bytes, text: str = "Describe the picture.") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return [{"type": "text", "text": text}, *parts]


# -- a text-only model ---------------------------------------------------------------------------------


def test_text_only_model_refuses_images_in_each_apis_shape(
    client: openai.OpenAI, anthropic_client: anthropic.Anthropic, gateway: GatewayProcess
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=CHAT_MODEL, max_tokens=4, messages=[{"role": "user", "content": chat_content(RED)}]
        )
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == "messages[0].content[1].image_url"
    assert CHAT_MODEL in err["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model=CHAT_MODEL,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is it?"},
                        {"type": "input_image", "image_url": data_url(RED), "detail": "auto"},
                    ],
                }
            ],
        )
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == "input[0].content[1].image_url"
    with pytest.raises(anthropic.BadRequestError) as anth:
        anthropic_client.messages.create(
            model=CHAT_MODEL,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)},
                        },
                        {"type": "text", "text": "What is it?"},
                    ],
                }
            ],
        )
    body = anth.value.response.json()
    assert body["type"] == "error" and CHAT_MODEL in body["error"]["message"]
    with ollama.Client(host=gateway.url, timeout=300) as oc, pytest.raises(ollama.ResponseError) as oll:
        oc.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "What is it?", "images": [RED]}])
    assert oll.value.status_code == 400 and oll.value.error == f'"{CHAT_MODEL}" does not support images'


# -- a vision model ----------------------------------------------------------------------------------


def _chat(client: openai.OpenAI, vlm: str, content: Any, max_tokens: int = 8) -> Any:
    return client.chat.completions.create(
        model=vlm,
        max_tokens=max_tokens,
        temperature=0,
        messages=[{"role": "user", "content": content}],
    )


def test_images_count_in_prompt_tokens(client: openai.OpenAI, vlm: str) -> None:
    text = _chat(client, vlm, chat_content(), max_tokens=1).usage.prompt_tokens
    red = _chat(client, vlm, chat_content(RED), max_tokens=1).usage.prompt_tokens
    blue = _chat(client, vlm, chat_content(BLUE), max_tokens=1).usage.prompt_tokens
    both = _chat(client, vlm, chat_content(RED, BLUE), max_tokens=1).usage.prompt_tokens
    # One image of a size costs the encoder's count of tokens, whatever it shows; two cost twice.
    per_image = red - text
    assert per_image > 0 and blue - text == per_image and both - text == 2 * per_image


def test_different_images_give_different_greedy_answers(client: openai.OpenAI, vlm: str) -> None:
    red = [_chat(client, vlm, chat_content(RED)).choices[0].message.content for _ in range(2)]
    blue = _chat(client, vlm, chat_content(BLUE)).choices[0].message.content
    assert red[0] == red[1]  # greedy: the same image, the same answer
    assert blue != red[0]


def test_a_repeated_image_hits_the_prompt_cache(client: openai.OpenAI, vlm: str) -> None:
    question = "Is this picture striped? Answer in one word."
    text_only = _chat(client, vlm, chat_content(text=question), max_tokens=1).usage.prompt_tokens
    content = chat_content(BLUE, text=question)
    first = _chat(client, vlm, content, max_tokens=1).usage
    again = _chat(client, vlm, content, max_tokens=1).usage
    assert again.prompt_tokens == first.prompt_tokens
    details = again.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    # The image follows the text: more cached than the text's tokens means its own were reused.
    assert details.cached_tokens > text_only


def test_every_api_and_client_reads_images(
    client: openai.OpenAI,
    anthropic_client: anthropic.Anthropic,
    gateway: GatewayProcess,
    vlm: str,
    langchain_http: dict[str, Any],
) -> None:
    expected = _chat(client, vlm, chat_content(RED), max_tokens=1).usage.prompt_tokens
    assert expected > _chat(client, vlm, chat_content(), max_tokens=1).usage.prompt_tokens
    response = client.responses.create(
        model=vlm,
        max_output_tokens=16,
        temperature=0,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe the picture."},
                    {"type": "input_image", "image_url": data_url(RED), "detail": "low"},
                ],
            }
        ],
    )
    assert response.status in ("completed", "incomplete") and response.usage is not None
    assert response.usage.input_tokens == expected
    message = anthropic_client.messages.create(
        model=vlm,
        max_tokens=4,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe the picture."},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)},
                    },
                ],
            }
        ],
    )
    # Anthropic counts what the cache served apart from `input_tokens`.
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == expected
    llm = ChatOpenAI(
        model=vlm,
        base_url=f"{gateway.url}/v1",
        api_key="unused",
        max_tokens=4,
        temperature=0,
        **langchain_http,
    )
    reply = llm.invoke(
        [
            HumanMessage(
                content=[
                    {"type": "text", "text": "Describe the picture."},
                    {"type": "image_url", "image_url": {"url": data_url(RED)}},
                ]
            )
        ]
    )
    assert reply.usage_metadata is not None and reply.usage_metadata["input_tokens"] == expected
    with ollama.Client(host=gateway.url, timeout=300) as oc:
        answer = oc.chat(
            model=vlm,
            messages=[{"role": "user", "content": "Describe the picture.", "images": [RED]}],
            options={"num_predict": 4, "temperature": 0},
        )
    assert answer.prompt_eval_count is not None and answer.prompt_eval_count > 0
    # curl, with the body on stdin (a data URL is too long for an argument on some systems).
    body = {
        "model": vlm,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": chat_content(RED)}],
    }
    done = subprocess.run(
        [
            *("curl", "-sS", "-f", f"{gateway.url}/v1/chat/completions"),
            *("-H", "Content-Type: application/json", "--data-binary", "@-"),
        ],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(done.stdout)["usage"]["prompt_tokens"] == expected


ERRORS: list[tuple[str, dict[str, Any], str]] = [
    # (what, chat content part, the field the 400 names)
    (
        "not an image",
        {"type": "image_url", "image_url": {"url": "data:text/plain;base64," + b64(b"hello\n")}},
        "not an image",
    ),
    ("truncated", {"type": "image_url", "image_url": {"url": data_url(RED[: len(RED) // 2])}}, "corrupt"),
    (
        "fetch off for a host",
        {"type": "image_url", "image_url": {"url": "http://images.invalid/a.png"}},
        "does not fetch",
    ),
]


@pytest.mark.parametrize(("what", "part", "words"), ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_images_are_400s_naming_the_field(
    gateway: GatewayProcess, vlm: str, what: str, part: dict[str, Any], words: str
) -> None:
    body = {
        "model": vlm,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}],
    }
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[1].image_url" and words in err["message"], err


def test_limits_in_each_apis_shape(gateway: GatewayProcess, vlm: str) -> None:
    """Too many images, on the Messages and Ollama routes: each in its own error shape."""
    many = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}}] * 9
    r = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": vlm, "max_tokens": 4, "messages": [{"role": "user", "content": many}]},
        timeout=120,
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "messages[0].content[8].source" in r.json()["error"]["message"]
    r = httpx.post(
        f"{gateway.url}/api/chat",
        json={
            "model": vlm,
            "stream": False,
            "messages": [{"role": "user", "content": "x", "images": [b64(b"not an image")]}],
        },
        timeout=120,
    )
    assert r.status_code == 400 and set(r.json()) == {"error"}
    assert "messages[0].images[0]" in r.json()["error"]


# -- image URLs (the test gateway allows 127.0.0.1 and localhost) -------------------------------------


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    """A real HTTP server on loopback: the red image, and a redirect to the same image by a name
    that resolves to loopback (listed, but private: refused)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/red.png":
                self.send_response(200)
                self.send_header("Content-Length", str(len(RED)))
                self.end_headers()
                self.wfile.write(RED)
            else:
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{server.server_address[1]}/red.png")
                self.send_header("Content-Length", "0")
                self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_image_urls_fetched_only_where_allowed(client: openai.OpenAI, vlm: str, image_server: str) -> None:
    by_url = _chat(
        client,
        vlm,
        [
            {"type": "text", "text": "Describe the picture."},
            {"type": "image_url", "image_url": {"url": f"{image_server}/red.png"}},
        ],
        max_tokens=1,
    )
    inline = _chat(client, vlm, chat_content(RED), max_tokens=1)
    assert by_url.usage.prompt_tokens == inline.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, vlm, [{"type": "image_url", "image_url": {"url": f"{image_server}/redirect"}}])
    assert "loopback" in str(info.value)
