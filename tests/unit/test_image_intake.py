"""Image intake (server/serving/images.py) and each API's image parts (protocol/images.py): every limit
and refusal on real image bytes made with PIL in memory, and URL fetching against a real local HTTP
server. No Ray, no model."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import random
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from PIL import Image

from raygate.protocol.capabilities import VisionConfig
from raygate.protocol.chat import ChatCompletionRequest
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import ImageInput
from raygate.protocol.images import ImageRef, ImageRefs, resolved
from raygate.protocol.messages import MessagesRequest
from raygate.protocol.ollama import ChatRequest, GenerateRequest
from raygate.protocol.response_items import engine_messages
from raygate.protocol.responses import CreateResponseRequest
from raygate.server.serving.images import FetchPolicy, read_images

# -- real images ------------------------------------------------------------------------------------


def png(
    width: int = 8, height: int = 8, color: tuple[int, int, int] = (200, 30, 30), noise: bool = False
) -> bytes:
    image = Image.new("RGB", (width, height), color)
    if noise:
        rng = random.Random(0)
        image.putdata(
            [(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(width * height)]
        )
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 12), (0, 90, 200)).save(out, "JPEG")
    return out.getvalue()


def bomb(side: int = 30_000) -> bytes:
    """A real decompression bomb: a ~100 KB PNG whose 1-bit rows inflate to side x side pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes((side + 7) // 8)
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def vlm(**vision: Any) -> ModelConfig:
    return ModelConfig(name="tiny-vlm", backend="synthetic", vision=VisionConfig(**vision))


TEXT_MODEL = ModelConfig(name="text-model", backend="synthetic")
REF = "messages[0].content[1].image_url"


def read(
    urls: list[str], config: ModelConfig | None = None, policy: FetchPolicy | None = None
) -> dict[str, ImageInput]:
    refs = [ImageRef(u, f"messages[0].content[{i}].image_url") for i, u in enumerate(urls)]
    return asyncio.run(read_images(refs, config or vlm(), policy or FetchPolicy()))


def refused(
    urls: list[str], config: ModelConfig | None = None, policy: FetchPolicy | None = None
) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        read(urls, config, policy)
    assert info.value.status_code == 400
    return info.value


# -- limits and refusals ----------------------------------------------------------------------------


def test_a_data_url_becomes_a_checked_image_input() -> None:
    data = png(12, 7)
    images = read([data_url(jpeg(), "image/jpeg"), data_url(data)])
    image = images["messages[0].content[1].image_url"]
    assert (image.width, image.height, image.format) == (12, 7, "PNG")
    assert image.data == data and image.digest == hashlib.sha256(data).hexdigest()
    assert images["messages[0].content[0].image_url"].format == "JPEG"


def test_a_text_only_model_is_named() -> None:
    err = refused([data_url(png())], TEXT_MODEL)
    assert "text-model" in err.message and err.param == "messages[0].content[0].image_url"


def test_too_many_images_names_the_first_one_over() -> None:
    err = refused([data_url(png())] * 3, vlm(max_images=2))
    assert err.param == "messages[0].content[2].image_url" and "at most 2 images" in err.message


def test_too_many_bytes_before_and_after_decoding() -> None:
    big = png(64, 64, noise=True)
    assert len(big) > 2048
    err = refused([data_url(big)], vlm(max_image_bytes=2048))
    assert "2048 bytes" in err.message and err.param == "messages[0].content[0].image_url"
    # Percent-encoded (not base64) data is counted once decoded.
    err = refused(["data:image/png," + "%00" * 3000], vlm(max_image_bytes=2048))
    assert "2048 bytes" in err.message


def test_too_many_pixels_is_read_from_the_header() -> None:
    err = refused([data_url(png(100, 50))], vlm(max_image_pixels=4999))
    assert "100x50" in err.message and "4999" in err.message


def test_a_decompression_bomb_never_decodes() -> None:
    payload = bomb(10_000)
    assert len(payload) < 100_000  # 100 million pixels in a small file
    err = refused([data_url(payload)])
    assert "10000x10000" in err.message
    # Past PIL's own bomb limit, even for a model that would allow that many pixels.
    err = refused([data_url(bomb(30_000))], vlm(max_image_pixels=1_000_000_000))
    assert "more pixels than" in err.message


def test_not_an_image_and_unsupported_formats() -> None:
    err = refused([data_url(b"hello, I am a text file\n", "text/plain")])
    assert "not an image" in err.message
    tiff = io.BytesIO()
    Image.new("RGB", (4, 4)).save(tiff, "TIFF")
    assert "not an image" in refused([data_url(tiff.getvalue())]).message
    assert "base64" in refused(["data:image/png;base64,@@@not-base64@@@"]).message
    assert "data:" in refused(["ftp://example.com/x.png"]).message
    assert "empty" in refused(["data:image/png;base64,"]).message


def test_a_truncated_png_is_corrupt() -> None:
    data = png(64, 64, noise=True)
    err = refused([data_url(data[: len(data) // 2])])
    assert "corrupt or truncated" in err.message


# -- each API's image parts -------------------------------------------------------------------------

IMG = data_url(png())


def walk(build: Any) -> list[ImageRef]:
    refs = ImageRefs()
    build(refs)
    return refs.refs


def test_chat_parts_keep_the_clients_order() -> None:
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare "},
                        {"type": "image_url", "image_url": {"url": IMG, "detail": "low"}},
                        {"type": "text", "text": "and"},
                        {"type": "image_url", "image_url": IMG},
                    ],
                },
            ],
        }
    )
    refs = walk(body.to_engine_messages)
    assert [r.param for r in refs] == ["messages[1].content[1].image_url", "messages[1].content[3].image_url"]
    assert refs[0].detail == "low"
    images = read([r.url for r in refs])
    by_param = {r.param: images[f"messages[0].content[{i}].image_url"] for i, r in enumerate(refs)}
    system, user = body.to_engine_messages(resolved(by_param))
    assert system.parts == () and user.content == "Compare and"
    assert [type(p).__name__ for p in user.parts] == ["str", "ImageInput", "str", "ImageInput"]
    # An image in an assistant turn, or a part nothing reads, is refused by name.
    with pytest.raises(BadRequestError) as info:
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}
        ).to_engine_messages(ImageRefs())
    assert info.value.param == "messages[0].content[0]"


def test_anthropic_image_blocks_base64_and_url() -> None:
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                        {"type": "text", "text": "What are these?"},
                    ],
                }
            ],
        }
    )
    refs = walk(body.to_engine_messages)
    assert [r.param for r in refs] == ["messages[0].content[0].source", "messages[0].content[1].source.url"]
    assert refs[0].url == "data:image/png;base64,AAAA" and refs[1].url == "https://example.com/a.png"


def test_responses_input_image_and_a_stored_turn() -> None:
    body = CreateResponseRequest.model_validate(
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Describe"},
                        {"type": "input_image", "image_url": IMG, "detail": "high"},
                    ],
                }
            ],
        }
    )
    items = body.input_items()
    refs = walk(lambda see: engine_messages(None, items, see))
    assert [(r.param, r.detail) for r in refs] == [("input[0].content[1].image_url", "high")]
    # A stored conversation (previous_response_id) keeps the image; its items have no request path.
    stored = [type(items[0]).model_validate(items[0].model_dump())]
    assert walk(lambda see: engine_messages(None, stored, see))[0].param == "conversation[0].content[1]"
    with pytest.raises(BadRequestError) as info:
        CreateResponseRequest.model_validate(
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}
        ).input_items()
    assert info.value.param == "input[0].content[0].image_url"


def test_ollama_images_keep_ollamas_field_paths() -> None:
    b64 = base64.b64encode(png()).decode()
    chat = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "What is it?", "images": [b64, b64]}]}
    ).to_openai("m")
    refs = walk(chat.to_engine_messages)
    assert [r.param for r in refs] == ["messages[0].images[0]", "messages[0].images[1]"]
    assert refs[0].url.endswith(b64)
    generate = GenerateRequest.model_validate({"model": "m", "prompt": "Describe", "images": [b64]})
    assert not generate.loads_only()
    assert [r.param for r in walk(generate.to_openai("m").to_engine_messages)] == ["images[0]"]  # type: ignore[union-attr]


# -- fetching http(s) URLs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    """A real HTTP server on loopback: an image, redirects, a slow answer, a 404."""
    picture = png(20, 10)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            port = server.server_address[1]
            if self.path == "/cat.png":
                self._send(200, picture)
            elif self.path == "/big.png":
                self._send(200, png(64, 64, noise=True))
            elif self.path == "/to-localhost":
                self._redirect(f"http://localhost:{port}/cat.png")
            elif self.path == "/to-metadata":
                self._redirect("http://169.254.169.254/latest/meta-data/")
            elif self.path == "/slow":
                time.sleep(3)
                self._send(200, picture)
            else:
                self._send(404, b"no")

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _redirect(self, where: str) -> None:
            self.send_response(302)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


LISTED = FetchPolicy(domains=("127.0.0.1", "localhost", "169.254.169.254"), timeout_s=1.0)


def test_fetching_is_off_by_default(image_server: str) -> None:
    err = refused([f"{image_server}/cat.png"])
    assert "does not fetch image URLs" in err.message and err.param == "messages[0].content[0].image_url"


def test_an_allow_listed_address_is_fetched(image_server: str) -> None:
    image = read([f"{image_server}/cat.png"], policy=LISTED)["messages[0].content[0].image_url"]
    assert (image.width, image.height, image.format) == (20, 10, "PNG")


def test_hosts_not_listed_and_private_addresses_are_refused(image_server: str) -> None:
    only_address = FetchPolicy(domains=("127.0.0.1",), timeout_s=1.0)
    port = image_server.rsplit(":", 1)[1]
    assert (
        "does not fetch images from `localhost`"
        in refused([f"http://localhost:{port}/cat.png"], policy=only_address).message
    )
    # A listed name that resolves to loopback is refused, directly and as a redirect's target.
    assert "loopback" in refused([f"http://localhost:{port}/cat.png"], policy=LISTED).message
    assert "loopback" in refused([f"{image_server}/to-localhost"], policy=LISTED).message
    # A redirect to a host not listed (a cloud metadata address) is refused before connecting.
    err = refused([f"{image_server}/to-metadata"], policy=only_address)
    assert "169.254.169.254" in err.message


def test_fetch_limits(image_server: str) -> None:
    assert "HTTP 404" in refused([f"{image_server}/missing.png"], policy=LISTED).message
    err = refused([f"{image_server}/big.png"], vlm(max_image_bytes=2048), policy=LISTED)
    assert "2048 bytes" in err.message
    err = refused([f"{image_server}/slow"], policy=FetchPolicy(domains=("127.0.0.1",), timeout_s=0.3))
    assert "did not arrive within 0.3 s" in err.message


def test_allow_list_matching() -> None:
    policy = FetchPolicy(domains=("images.example.com", "*.cdn.example.org"))
    assert policy.allows("images.example.com") and policy.allows("IMAGES.example.com.")
    assert policy.allows("a.b.cdn.example.org") and not policy.allows("cdn.example.org.evil.com")
    assert not policy.allows("example.com") and not policy.allows("evilcdn.example.org")
