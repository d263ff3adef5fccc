"""Images into the batched llama.cpp engine through libmtmd (llama.cpp's multimodal library, the
one llama-server's `--mmproj` uses): the projector's context, a prompt with images as tokens and
image spans, and an image span's evaluation into one sequence's KV cells.

How an image joins the token stream: the chat template is rendered with this context's media
marker where each image goes; `mtmd_tokenize` cuts the text at the markers and replaces each by the
model's image layout (for Idefics3/SmolVLM: the tiles and the overview between their marker
tokens), as a list of text chunks and image chunks. Text chunks stay token ids; an image chunk of
n embeddings becomes n *pseudo token ids*: negative numbers (never a vocabulary id) derived from
the image's digest (sha256 of its bytes) and the chunk's place in the image. The prompt is then one
list of ints as before, and everything keyed by a prompt's tokens works unchanged: the slots'
longest-prefix reuse, the host prompt store, the kept logits. The same image bytes in the same
place give the same ids, so a repeated image reuses its KV cells and those after it, as
llama-server keys its cache by image hash; another image differs at its first id.

The decoder feeds text tokens as before, stopping at an image span; the scheduler evaluates the
span (`Projector.evaluate`) on its own `llama_decode`, then text goes on. An image's encoded
embeddings (the vision tower's and projector's output) are also kept by digest
(`EncodedImages`), so the same image after another prefix skips the vision tower.

Not supported here: M-RoPE models (Qwen2-VL and later: an image takes fewer positions than KV
cells, which the decoder's one-position-per-token accounting does not express); such a projector
is refused when the model loads.
"""

from __future__ import annotations

import ctypes
import hashlib
import secrets
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from raygate.backends.engines.images import decode_rgb
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import ImageInput

# A pseudo id: -(1 + (48 bits of the chunk's hash << 16) + k), k < 2**16 the token's place in the
# chunk (no image chunk of any model comes near 65,536 embeddings).
_K_BITS = 16

# Host memory for encoded images (`EncodedImages`), per replica: 80 x 576 floats (184 KB) for the
# test model's image, ~2-16 MB for real ones.
ENCODED_IMAGES_BYTES = 64 * 2**20


def pseudo_ids(digest: str, ordinal: int, n: int) -> list[int]:
    """The ids of chunk `ordinal` (its place among the image's chunks) of the image `digest`."""
    if n >= 1 << _K_BITS:
        raise BadRequestError(f"An image of {n} tokens is more than this engine takes.", param="messages")
    base = int.from_bytes(hashlib.sha256(f"{digest}:{ordinal}".encode()).digest()[:6], "big") << _K_BITS
    return [-(1 + base + k) for k in range(n)]


def text_tokens(tokens: list[int]) -> list[int]:
    """The prompt's real token ids (the repetition penalty's history: images are not words)."""
    return [t for t in tokens if t >= 0]


class _Chunk:
    """An owned copy of one of mtmd's input chunks, freed with this object (when the last request
    holding it is done, whichever thread drops it)."""

    __slots__ = ("__weakref__", "ptr")

    def __init__(self, mtmd: Any, chunk: Any) -> None:
        self.ptr = mtmd.mtmd_input_chunk_copy(chunk)
        if not self.ptr:
            raise MemoryError("mtmd_input_chunk_copy failed")
        weakref.finalize(self, mtmd.mtmd_input_chunk_free, self.ptr)


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """An image chunk of a prompt: its first position, its pseudo ids' count, which image and
    which of its chunks (`ordinal`), and the chunk mtmd evaluates."""

    start: int
    n_tokens: int
    digest: str
    ordinal: int
    chunk: _Chunk

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


def next_span(spans: tuple[ImageSpan, ...], position: int) -> ImageSpan | None:
    """The first span that starts at or after `position`."""
    return next((s for s in spans if s.start >= position), None)


def truncated(
    spans: tuple[ImageSpan, ...], tokens: list[int], keep: int
) -> tuple[tuple[ImageSpan, ...], list[int]]:
    """`truncate_prompt_tokens` on a prompt with images: the last `keep` tokens, less the rest of
    an image the cut would halve (a part of an image is no image)."""
    cut = len(tokens) - keep
    if cut <= 0:
        return spans, tokens
    for span in spans:
        if span.start < cut < span.end:
            cut = span.end
    kept = tuple(
        ImageSpan(s.start - cut, s.n_tokens, s.digest, s.ordinal, s.chunk) for s in spans if s.start >= cut
    )
    return kept, tokens[cut:]


def span_floor(spans: tuple[ImageSpan, ...], position: int) -> int:
    """`position`, moved back to the start of the image span it falls inside: a prefix kept in
    the KV cache ends between images, never halfway through one."""
    for span in spans:
        if span.start < position < span.end:
            return span.start
    return position


class EncodedImages:
    """Encoded image chunks by (digest, ordinal), least recently used out first, within a byte
    budget. Only the scheduler thread reads and writes it."""

    def __init__(self, capacity: int = ENCODED_IMAGES_BYTES) -> None:
        self.capacity = capacity
        self.used = 0
        self._rows: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    def get(self, key: tuple[str, int]) -> np.ndarray | None:
        rows = self._rows.get(key)
        if rows is not None:
            self._rows.move_to_end(key)
        return rows

    def put(self, key: tuple[str, int], rows: np.ndarray) -> None:
        if rows.nbytes > self.capacity:
            return
        old = self._rows.pop(key, None)
        if old is not None:
            self.used -= old.nbytes
        self._rows[key] = rows
        self.used += rows.nbytes
        while self.used > self.capacity:
            _, evicted = self._rows.popitem(last=False)
            self.used -= evicted.nbytes


def _rgb(image: ImageInput) -> tuple[int, int, bytes]:
    """The image's pixels as 8-bit RGB, decoded by Pillow as vLLM's processors decode them
    (llama.cpp's own decoder lacks WEBP)."""
    rgb = decode_rgb(image)
    return rgb.width, rgb.height, rgb.tobytes()


class Projector:
    """An mtmd context on a loaded text model: `engine`'s `vision.projector` GGUF (mmproj)."""

    def __init__(self, mtmd: Any, ctx: Any, marker: str) -> None:
        self._mtmd = mtmd
        self._ctx = ctx
        self.marker = marker
        self.encoded = EncodedImages()
        self._finalizer = weakref.finalize(self, mtmd.mtmd_free, ctx)

    @classmethod
    def load(cls, path: str, llama_model: Any, n_threads: int) -> Projector:
        """Blocking (the projector's weights, a warm-up encode). `llama_model`: the text model's
        `llama_model *`. A marker no client can guess: a user's text holding llama.cpp's default
        `<__media__>` stays text."""
        from llama_cpp import mtmd_cpp

        marker = f"<__raygate_image_{secrets.token_hex(8)}__>"
        params = mtmd_cpp.mtmd_context_params_default()
        params.n_threads = n_threads
        params.print_timings = False
        params.media_marker = marker.encode()
        ctx = mtmd_cpp.mtmd_init_from_file(path.encode(), llama_model, params)
        if not ctx:
            raise ValueError(f"llama.cpp could not load the projector {path}")
        projector = cls(mtmd_cpp, ctx, marker)
        if not mtmd_cpp.mtmd_support_vision(ctx):
            raise ValueError(f"{path} is not a vision projector (mmproj)")
        if mtmd_cpp.mtmd_decode_use_mrope(ctx):
            raise ValueError(f"{path}: M-RoPE vision models are not supported by this engine yet")
        return projector

    def close(self) -> None:
        self._finalizer()

    def tokenize(
        self, text: str, add_special: bool, images: list[ImageInput]
    ) -> tuple[list[int], tuple[ImageSpan, ...]]:
        """The prompt's ids (pseudo ids for the images) and its image spans. `text` holds one
        marker per image, in order. Blocking: decodes and resizes the images (preprocessing)."""
        mtmd = self._mtmd
        bitmaps = []
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            for image in images:
                nx, ny, pixels = _rgb(image)
                buf = (ctypes.c_uint8 * len(pixels)).from_buffer_copy(pixels)
                bitmap = mtmd.mtmd_bitmap_init(nx, ny, buf)
                if not bitmap:
                    raise BadRequestError(
                        "llama.cpp could not take an image of this request.", param="messages"
                    )
                bitmaps.append(bitmap)
                mtmd.mtmd_bitmap_set_id(bitmap, image.digest.encode())
            raw = text.encode()
            arg = mtmd.mtmd_input_text(raw, len(raw), add_special, True)
            array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            rc = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(arg), array, len(bitmaps))
            if rc != 0:
                raise BadRequestError(
                    f"llama.cpp could not place the images of this request (mtmd_tokenize: {rc}).",
                    param="messages",
                )
            return self._read(chunks, images)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _read(self, chunks: Any, images: list[ImageInput]) -> tuple[list[int], tuple[ImageSpan, ...]]:
        mtmd = self._mtmd
        tokens: list[int] = []
        # An image of K chunks that appears m times gives m*K chunks with its digest: the
        # ordinal within one copy is the running count modulo K.
        copies: dict[str, int] = {}
        for image in images:
            copies[image.digest] = copies.get(image.digest, 0) + 1
        seen: dict[str, int] = {}
        found: list[tuple[int, int, str, int, _Chunk]] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(ids[: n.value])
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise BadRequestError("This model's projector is not for images.", param="messages")
            digest = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            found.append((len(tokens), n_tokens, digest, seen.get(digest, 0), _Chunk(mtmd, chunk)))
            seen[digest] = seen.get(digest, 0) + 1
            tokens.extend([0] * n_tokens)  # their ids once the chunks per image are counted
        spans: list[ImageSpan] = []
        for start, n_tokens, digest, index, owned in found:
            ordinal = index % max(1, seen[digest] // copies.get(digest, 1))
            tokens[start : start + n_tokens] = pseudo_ids(digest, ordinal, n_tokens)
            spans.append(ImageSpan(start, n_tokens, digest, ordinal, owned))
        return tokens, tuple(spans)

    def evaluate(self, lctx: Any, span: ImageSpan, position: int, seq_id: int, n_batch: int) -> None:
        """Encode the image chunk (or take its encoding from `encoded`) and decode its embeddings
        into sequence `seq_id` from `position`. On the thread that owns `lctx`."""
        mtmd = self._mtmd
        key = (span.digest, span.ordinal)
        rows = self.encoded.get(key)
        if rows is None:
            if mtmd.mtmd_encode_chunk(self._ctx, span.chunk.ptr) != 0:
                raise RuntimeError("mtmd_encode_chunk failed")
            import llama_cpp

            width = llama_cpp.llama_model_n_embd_inp(llama_cpp.llama_get_model(lctx))
            out = mtmd.mtmd_get_output_embd(self._ctx)
            rows = np.ctypeslib.as_array(out, shape=(span.n_tokens * width,)).copy()
            self.encoded.put(key, rows)
        new_position = ctypes.c_int32(0)
        rc = mtmd.mtmd_helper_decode_image_chunk(
            self._ctx,
            lctx,
            span.chunk.ptr,
            rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            position,
            seq_id,
            n_batch,
            ctypes.byref(new_position),
            mtmd.mtmd_helper_post_decode_callback(),
            None,
        )
        if rc != 0:
            raise RuntimeError(f"decoding an image failed (mtmd_helper_decode_image_chunk: {rc})")
        if new_position.value != position + span.n_tokens:
            raise RuntimeError("an image took other positions than its tokens")
