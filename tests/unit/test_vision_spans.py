"""A prompt's images in the batched llama.cpp engine, without a model (`llama_cpp/vision.py`): the
pseudo ids an image's tokens take (its digest's, so the prompt cache keys an image by its bytes),
where a kept prefix may end, truncation, and the decode batch stopping at an image span."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from llama_cpp import _internals

from raygate.backends.engines.llama_cpp.decode_batch import RunningSequence, fill
from raygate.backends.engines.llama_cpp.vision import (
    ImageSpan,
    pseudo_ids,
    span_floor,
    text_tokens,
    truncated,
)


def _span(start: int, n: int, digest: str = "a" * 64, ordinal: int = 0) -> ImageSpan:
    chunk: Any = None  # only the scheduler's evaluation reads it
    return ImageSpan(start, n, digest, ordinal, chunk)


def test_pseudo_ids_are_the_digests_and_never_a_token() -> None:
    red, blue = "a" * 64, "b" * 64
    assert pseudo_ids(red, 0, 16) == pseudo_ids(red, 0, 16)  # the same bytes: the same ids
    ids = {*pseudo_ids(red, 0, 16), *pseudo_ids(red, 1, 16), *pseudo_ids(blue, 0, 16)}
    assert len(ids) == 48 and max(ids) < 0
    assert text_tokens([5, *pseudo_ids(red, 0, 3), 7]) == [5, 7]


def test_a_kept_prefix_ends_between_images() -> None:
    spans = (_span(4, 16), _span(24, 16))
    assert [span_floor(spans, p) for p in (0, 4, 5, 19, 20, 21, 30, 40, 41)] == [
        0,
        4,
        4,
        4,
        20,
        21,
        24,
        40,
        41,
    ]


def test_truncation_drops_a_halved_image_whole() -> None:
    tokens = list(range(50))
    spans = (_span(4, 16), _span(24, 16))
    kept_spans, kept = truncated(spans, tokens, 35)  # the cut (15) falls inside the first image
    assert kept == tokens[20:] and [(s.start, s.n_tokens) for s in kept_spans] == [(4, 16)]
    assert truncated(spans, tokens, 50) == (spans, tokens)


def test_the_decode_batch_stops_at_an_image() -> None:
    batch = _internals.LlamaBatch(n_tokens=32, embd=0, n_seq_max=1, verbose=False)
    prompt = [1, 2, 3, *pseudo_ids("c" * 64, 0, 4), 8, 9]
    seq = RunningSequence(prompt, sampler=None, out=None, feed=SimpleNamespace(full=False))  # type: ignore[arg-type]
    seq.images = (_span(3, 4, "c" * 64),)
    cached: list[list[int]] = [[]]
    outputs, _ = fill(batch, {0: seq}, cached, n_batch=32)
    assert cached[0] == [1, 2, 3] and seq.fed == 3 and outputs == []  # no logits: the prompt goes on
    assert seq.image_at_fed() is seq.images[0]
    # The scheduler evaluates the image (4 cells), then the text after it is fed with the last logits.
    cached[0] += prompt[3:7]
    seq.fed = 7
    outputs, _ = fill(batch, {0: seq}, cached, n_batch=32)
    assert cached[0] == prompt and outputs == [(0, 1)] and seq.image_at_fed() is None
