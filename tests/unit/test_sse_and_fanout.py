"""The gateway's two stream pumps, on `raygate.backends.streams.Pump`: SSE frames joined into one write
(`raygate.server.serving.streaming`) and `n` sequences merged into one stream (`raygate.server.serving.fanout`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from raygate.protocol.errors import BadRequestError, EngineError
from raygate.protocol.generation import Delta
from raygate.server.serving.fanout import merge
from raygate.server.serving.streaming import Event, _frames, ndjson_line, sse_response


async def _payloads(values: list[str], fail: Exception | None = None) -> AsyncIterator[str]:
    for v in values:
        yield v
    if fail is not None:
        raise fail


async def _body(first: str | None, payloads: AsyncIterator[str]) -> list[bytes]:
    return [chunk async for chunk in _frames(first, payloads)]


async def test_frames_ready_together_leave_in_one_write_ending_with_done() -> None:
    chunks = await _body('{"a":1}', _payloads(['{"a":2}', '{"a":3}']))
    assert chunks == [b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: {"a":3}\n\ndata: [DONE]\n\n']


async def test_a_frame_is_not_held_back_for_the_next() -> None:
    gate = asyncio.Event()

    async def slow() -> AsyncIterator[str]:
        yield "1"
        await gate.wait()
        yield "2"

    body = _frames(None, slow())
    assert await asyncio.wait_for(anext(body), 1) == b"data: 1\n\n"
    gate.set()
    assert await anext(body) == b"data: 2\n\ndata: [DONE]\n\n"


async def test_an_empty_stream_is_just_done() -> None:
    assert await _body(None, _payloads([])) == [b"data: [DONE]\n\n"]


async def test_a_typed_error_after_the_headers_goes_in_band_then_done() -> None:
    body = b"".join(await _body("1", _payloads(["2"], BadRequestError("late", param="x"))))
    frames = body.split(b"\n\n")
    assert frames[:2] == [b"data: 1", b"data: 2"]
    assert json.loads(frames[2].removeprefix(b"data: ")) == BadRequestError("late", param="x").to_body()
    assert frames[3:] == [b"data: [DONE]", b""]


async def test_an_untyped_error_is_an_in_band_engine_error() -> None:
    body = b"".join(await _body(None, _payloads([], ZeroDivisionError("oops"))))
    error = json.loads(body.split(b"\n\n")[0].removeprefix(b"data: "))
    assert error == EngineError("Stream failed: oops").to_body()
    assert body.endswith(b"data: [DONE]\n\n")


async def test_an_error_before_the_first_payload_is_raised_for_an_http_status() -> None:
    with pytest.raises(BadRequestError):
        await sse_response(_payloads([], BadRequestError("early")))


async def test_closing_the_body_closes_the_payload_stream() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[str]:
        try:
            while True:
                yield "x"
                await asyncio.sleep(0.001)
        finally:
            closed.set()

    body = _frames(None, endless())
    await anext(body)
    await body.aclose()  # type: ignore[attr-defined]
    assert closed.is_set()


# -- fan-out -------------------------------------------------------------------------------------


async def _deltas(texts: list[str], fail: Exception | None = None, pause: float = 0) -> AsyncIterator[Delta]:
    for i, text in enumerate(texts, 1):
        if pause:
            await asyncio.sleep(pause)
        yield Delta(text, i, 1, "stop" if i == len(texts) else None)
    if fail is not None:
        raise fail


async def test_merge_tags_each_delta_with_its_stream_and_keeps_each_streams_order() -> None:
    got = [(i, d.text) async for i, d in merge([_deltas(["a", "b", "c"]), _deltas(["x", "y"])])]
    assert sorted(got) == [(0, "a"), (0, "b"), (0, "c"), (1, "x"), (1, "y")]
    assert [t for i, t in got if i == 0] == ["a", "b", "c"]
    assert [t for i, t in got if i == 1] == ["x", "y"]


async def test_merge_of_one_stream_is_that_stream() -> None:
    assert [(i, d.text) async for i, d in merge([_deltas(["a", "b"])])] == [(0, "a"), (0, "b")]


async def test_merge_raises_the_first_error_and_closes_the_other_streams() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[Delta]:
        try:
            while True:
                await asyncio.sleep(0.001)
                yield Delta("z", 1, 1)
        finally:
            closed.set()

    with pytest.raises(EngineError):
        async for _ in merge([endless(), _deltas(["a"], EngineError("replica failed"), pause=0.01)]):
            pass
    assert closed.is_set()


async def test_unicode_line_breaks_in_a_token_do_not_split_a_frame_for_line_readers() -> None:
    """httpx's `iter_lines()` (the ollama client's reader, and many SSE readers') splits at every
    line boundary `str.splitlines()` knows, U+2028 / U+2029 / U+0085 included, which JSON leaves raw
    in strings: a token holding one cut its frame ("Unterminated string", issue 51's chaos run)."""
    text = "a\u2028b\x85c\u2029d é"
    payload = json.dumps({"choices": [{"text": text}]}, ensure_ascii=False)
    sse = b"".join(await _body(payload, _payloads([])))
    ndjson = ndjson_line(payload) + ndjson_line(Event("message", payload))
    for body, prefix in ((sse, "data: "), (ndjson, "")):
        lines = [line for line in httpx.Response(200, content=body).iter_lines() if line]
        frames = [json.loads(line.removeprefix(prefix)) for line in lines if line != "data: [DONE]"]
        assert [f["choices"][0]["text"] for f in frames] == [text] * len(frames) and frames
