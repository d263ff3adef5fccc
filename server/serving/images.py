"""Image intake: from the references a request carries (`ImageRef`, protocol/images.py) to checked
`ImageInput`s, before anything reaches an engine (docs/vision.md).

Every API's images pass here, so every limit holds the same on all of them, and each refusal is a
400 naming the field it is about (the error body's shape is the route's, server/transport/errors.py):

- a model without a `vision:` block is asked to see: 400 naming the model;
- more than its `max_images`;
- more than `max_image_bytes` encoded, counted before a `data:` URL is decoded and while a fetch
  reads (it stops one byte past the limit);
- more than `max_image_pixels`, read from the image's header BEFORE its pixels are decoded, so a
  decompression bomb costs a header read (PIL's own `DecompressionBombError` is the same 400);
- bytes that are no image of a format the engines read (PNG, JPEG, WEBP, GIF, BMP), or a corrupt
  or truncated one (verified, then fully decoded once, so the engine never gets one it cannot read).

Decoding runs in a worker thread (`asyncio.to_thread`): a large image never stalls the event loop.

`http(s)` URLs are fetched only for hosts the operator lists (`--image-fetch-domain`; none by
default: a 400 says fetching is off). Each hop is checked before it is connected to: its host must
be listed, and the address it resolves to must be public unless the operator listed that address
itself (so a redirect, or a DNS answer, cannot point the gateway at loopback, private or
link-local addresses such as a cloud metadata service). The connection goes to the checked address
(the host travels in `Host` and TLS's SNI), the body is read to the model's byte limit, and the
whole fetch is bounded by `--image-fetch-timeout`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import ipaddress
import socket
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes, urljoin, urlsplit

import httpx
from PIL import Image, UnidentifiedImageError

from raygate.protocol.capabilities import VisionConfig
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import ImageInput
from raygate.protocol.images import ImageRef
from raygate.server.settings import Settings

# The formats both engines' image processors read; anything else is refused by name.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MAX_REDIRECTS = 3
_CHUNK = 64 * 1024


def ImageError(ref: ImageRef, why: str) -> BadRequestError:  # noqa: N802 (raised like a class)
    """400: an image the model cannot be given; the message starts with the field it is about."""
    return BadRequestError(f"`{ref.param}`: {why}", param=ref.param)


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """Which `http(s)` images the gateway fetches: the operator's hosts (`*.example.com` takes its
    subdomains), and how long one fetch may take. No hosts: fetching is off."""

    domains: tuple[str, ...] = ()
    timeout_s: float = 10.0

    def allows(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for listed in self.domains:
            entry = listed.lower().rstrip(".")
            if host == entry or (entry.startswith("*.") and host.endswith(entry[1:])):
                return True
        return False

    def names_address(self, host: str) -> bool:
        """Whether the operator listed this IP address itself (then it may be a private one)."""
        return _ip(host) is not None and host.lower() in (d.lower() for d in self.domains)


def fetch_policy(settings: Settings) -> FetchPolicy:
    return FetchPolicy(settings.image_fetch_domains, settings.image_fetch_timeout_s)


async def read_images(
    refs: Sequence[ImageRef], config: ModelConfig, policy: FetchPolicy
) -> dict[str, ImageInput]:
    """Every image of a request, read and checked, by field path; `{}` for a request with none."""
    if not refs:
        return {}
    vision = config.vision
    if vision is None:
        raise BadRequestError(
            f"Model `{config.name}` does not support image input (it is a text-only model; "
            f"`{refs[0].param}` is an image).",
            param=refs[0].param,
        )
    if len(refs) > vision.max_images:
        raise ImageError(
            refs[vision.max_images],
            f"at most {vision.max_images} images per request for model `{config.name}`, "
            f"this request has {len(refs)}.",
        )
    out: dict[str, ImageInput] = {}
    for ref in refs:
        out[ref.param] = await read_image(ref, vision, policy)
    return out


async def read_image(ref: ImageRef, vision: VisionConfig, policy: FetchPolicy) -> ImageInput:
    """One image: its bytes (a `data:` URL's, or fetched), then checked off the event loop."""
    scheme = urlsplit(ref.url).scheme.lower() if ":" in ref.url else ""
    if scheme == "data":
        return await asyncio.to_thread(_from_data_url, ref, vision)
    if scheme in ("http", "https"):
        data = await fetch(ref, vision.max_image_bytes, policy)
        return await asyncio.to_thread(inspect, ref, data, vision)
    raise ImageError(ref, "an image is a `data:` URL (base64) or an `http(s)` URL.")


def _from_data_url(ref: ImageRef, vision: VisionConfig) -> ImageInput:
    head, comma, payload = ref.url.partition(",")
    if not comma:
        raise ImageError(ref, "a `data:` URL needs a `,` before its data.")
    if head.lower().endswith(";base64"):
        # 4 base64 characters hold 3 bytes: refuse an oversized image before decoding it.
        if (len(payload) - payload.count("=")) * 3 // 4 > vision.max_image_bytes:
            raise _too_big(ref, vision)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ImageError(ref, "the `data:` URL's base64 is not valid.") from None
    else:
        if len(payload) > 3 * vision.max_image_bytes:
            raise _too_big(ref, vision)
        data = unquote_to_bytes(payload)
    return inspect(ref, data, vision)


def _too_big(ref: ImageRef, vision: VisionConfig) -> BadRequestError:
    return ImageError(ref, f"the image is larger than this model's {vision.max_image_bytes} bytes per image.")


def inspect(ref: ImageRef, data: bytes, vision: VisionConfig) -> ImageInput:
    """Checks the encoded bytes (blocking: run in a thread) and describes them as an `ImageInput`."""
    if len(data) > vision.max_image_bytes:
        raise _too_big(ref, vision)
    if not data:
        raise ImageError(ref, "the image is empty.")
    try:
        with _open(data) as image:
            width, height = image.size
            fmt = str(image.format)
            # The header's size, before any pixel is decoded.
            if width * height > vision.max_image_pixels:
                raise ImageError(
                    ref,
                    f"the image is {width}x{height} pixels, more than this model's "
                    f"{vision.max_image_pixels} pixels per image.",
                )
            image.verify()
        with _open(data) as image:
            image.load()  # a truncated or corrupt file fails here, not in the engine
    except Image.DecompressionBombError:
        raise ImageError(
            ref, f"the image has more pixels than this model's {vision.max_image_pixels} per image."
        ) from None
    except UnidentifiedImageError:
        raise ImageError(ref, f"not an image in a format the model reads ({', '.join(FORMATS)}).") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(ref, f"the image is corrupt or truncated ({exc}).") from None
    return ImageInput(
        data=data, digest=hashlib.sha256(data).hexdigest(), width=width, height=height, format=fmt
    )


def _open(data: bytes) -> Image.Image:
    """PIL's lazy open (the header only). PIL warns past its own pixel limit (and refuses past
    twice that); the model's limit, checked by the caller, decides below it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data), formats=FORMATS)


# -- fetching -------------------------------------------------------------------------------------


async def fetch(ref: ImageRef, max_bytes: int, policy: FetchPolicy) -> bytes:
    """The body at `ref.url`, hop by hop (each hop checked), within the policy's time."""
    if not policy.domains:
        raise ImageError(
            ref,
            "this gateway does not fetch image URLs (its operator allows none: "
            "`--image-fetch-domain`); send the image as a `data:` URL.",
        )
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _fetch(ref, max_bytes, policy)
    except TimeoutError:
        raise ImageError(ref, f"the image did not arrive within {policy.timeout_s:g} s.") from None
    except httpx.HTTPError as exc:
        raise ImageError(ref, f"the image could not be fetched ({type(exc).__name__}).") from None


async def _fetch(ref: ImageRef, max_bytes: int, policy: FetchPolicy) -> bytes:
    url = ref.url
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
        for _hop in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            host = parts.hostname or ""
            if parts.scheme not in ("http", "https") or not host:
                raise ImageError(ref, "a redirect led to a URL that is not `http(s)`.")
            if not policy.allows(host):
                raise ImageError(ref, f"this gateway does not fetch images from `{host}`.")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            address = await _public_address(ref, host, port, policy)
            netloc = f"[{address}]" if ":" in address else address
            target = parts._replace(netloc=f"{netloc}:{port}").geturl()
            headers = {"Host": parts.netloc.rpartition("@")[2], "Accept": "image/*"}
            request = client.build_request("GET", target, headers=headers)
            if parts.scheme == "https":
                request.extensions["sni_hostname"] = host
            response = await client.send(request, stream=True)
            try:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise ImageError(ref, f"fetching the image answered HTTP {response.status_code}.")
                body = bytearray()
                async for chunk in response.aiter_bytes(_CHUNK):
                    body += chunk
                    if len(body) > max_bytes:
                        raise ImageError(
                            ref, f"the image is larger than this model's {max_bytes} bytes per image."
                        )
                return bytes(body)
            finally:
                await response.aclose()
    raise ImageError(ref, f"more than {MAX_REDIRECTS} redirects.")


async def _public_address(ref: ImageRef, host: str, port: int, policy: FetchPolicy) -> str:
    """The address to connect to: resolved once, and refused if it is not public (unless the
    operator listed that very address)."""
    literal = _ip(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise ImageError(ref, f"the host `{host}` does not resolve.") from None
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
    if not addresses:
        raise ImageError(ref, f"the host `{host}` does not resolve.")
    if not policy.names_address(host):
        for address in addresses:
            if not _public(address):
                raise ImageError(
                    ref, f"`{host}` is a private, loopback or link-local address ({address}): not fetched."
                )
    return str(addresses[0])


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast
