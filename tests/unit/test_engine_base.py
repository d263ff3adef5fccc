"""What `raygate.backends.engines.base` owns for every engine: the counters, the ids in flight, `abort()`,
the not-loaded check, the token-id range check and unit normalisation. Exercised through the
synthetic engine (no model) and a minimal engine of our own."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from raygate.backends.engines.base import Engine, check_token_ids, loaded
from raygate.backends.engines.synthetic.engine import SyntheticEngine
from raygate.protocol.embeddings import unit_vector
from raygate.protocol.errors import BadRequestError, EngineError
from raygate.protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    SamplingParams,
)


def test_unit_vector_has_length_one_and_keeps_direction() -> None:
    v = unit_vector([3.0, 4.0])
    assert v == pytest.approx([0.6, 0.8])
    assert math.isclose(math.hypot(*unit_vector([1e-3, -2e-3, 5e-4])), 1.0)


def test_unit_vector_of_zero_stays_zero() -> None:
    assert unit_vector([0.0, 0.0]) == [0.0, 0.0]


def test_token_ids_outside_the_vocabulary_are_a_400_naming_the_field() -> None:
    check_token_ids([0, 5, 9], 10, "prompt")
    check_token_ids([], 10, "prompt")
    for bad in ([10], [-1], [3, 10_000]):
        with pytest.raises(BadRequestError, match=r"Token ids must be in \[0, 10\)\.") as info:
            check_token_ids(bad, 10, "input")
        assert info.value.param == "input"


def test_loaded_refuses_a_call_before_start() -> None:
    assert loaded("model") == "model"
    with pytest.raises(EngineError, match="engine is not loaded"):
        loaded(None)


class _Steps(Engine):
    """Yields `n` deltas, each after its gate opens; stops early when aborted; can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def start(self) -> None:
        return None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        n = request.sampling.max_tokens or 3
        with self._running(request.request_id) as run:
            for i in range(1, n + 1):
                await self.gate.wait()
                if run.cancel.is_set():
                    yield Delta("", i - 1, 1, "abort")
                    break
                if request.prompt == "fail" and i == 2:
                    raise EngineError("failed mid-stream")
                self._stats.tokens_generated_total += 1
                yield Delta("t", i, 1, "length" if i == n else None)
            run.ended = True

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        raise NotImplementedError

    async def count_tokens(self, text: str) -> int:
        return 0

    @property
    def context_length(self) -> int:
        return 100

    async def check_health(self) -> None:
        return None


def _request(rid: str, prompt: str = "p", max_tokens: int = 3) -> GenerateRequest:
    return GenerateRequest(rid, SamplingParams(max_tokens=max_tokens), prompt=prompt)


async def test_a_finished_request_is_counted_and_leaves_no_trace() -> None:
    engine = _Steps()
    engine.gate.set()
    deltas = [d async for d in engine.generate(_request("a"))]
    assert deltas[-1].finish_reason == "length"
    s = engine.stats()
    assert (s.requests_total, s.running, s.aborted_total, s.tokens_generated_total) == (1, 0, 0, 3)
    assert s.running_ids == ()


async def test_running_ids_and_abort() -> None:
    engine = _Steps()
    stream = engine.generate(_request("r-1", max_tokens=50))
    engine.gate.set()
    await anext(stream)
    assert engine.stats().running_ids == ("r-1",) and engine.stats().running == 1
    assert await engine.abort("r-1")
    assert not await engine.abort("nobody")
    rest = [d async for d in stream]
    assert rest[-1].finish_reason == "abort"
    s = engine.stats()
    # Stopped by abort(), the engine ended the stream itself: not counted as a client abort.
    assert (s.running, s.aborted_total, s.running_ids) == (0, 0, ())


async def test_a_consumer_that_leaves_counts_as_aborted() -> None:
    engine = _Steps()
    engine.gate.set()
    stream = engine.generate(_request("gone", max_tokens=50))
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    s = engine.stats()
    assert (s.running, s.aborted_total, s.running_ids) == (0, 1, ())


async def test_a_cancelled_consumer_counts_as_aborted() -> None:
    engine = _Steps()

    async def consume() -> None:
        async for _ in engine.generate(_request("c")):
            pass

    task = asyncio.create_task(consume())
    # A poll, not an event: yield to the consumer task until it is inside the engine.
    while not engine.stats().running:  # noqa: ASYNC110
        await asyncio.sleep(0)
    task.cancel()  # lands in `await gate.wait()`
    with pytest.raises(asyncio.CancelledError):
        await task
    s = engine.stats()
    assert (s.running, s.aborted_total) == (0, 1)


async def test_an_engine_error_is_not_an_abort() -> None:
    engine = _Steps()
    engine.gate.set()
    with pytest.raises(EngineError):
        async for _ in engine.generate(_request("f", prompt="fail")):
            pass
    s = engine.stats()
    assert (s.requests_total, s.running, s.aborted_total) == (1, 0, 0)


async def test_the_synthetic_engine_uses_the_shared_bookkeeping() -> None:
    engine = SyntheticEngine({"token_ms": 1})
    stream = engine.generate(_request("s-1", max_tokens=1000))
    await anext(stream)
    assert engine.stats().running_ids == ("s-1",)
    assert await engine.abort("s-1")
    rest = [d async for d in stream]
    assert len(rest) < 999  # stopped early
    vectors = (await engine.embed(EmbedRequest(inputs=["a", "b"], request_id="e"))).embeddings
    assert all(math.isclose(math.hypot(*v), 1.0) for v in vectors)
    assert engine.stats().running == 0


async def test_a_consumer_that_closes_on_the_last_delta_did_not_abort() -> None:
    """The gateway closes a stream as soon as it has read the delta with `finish_reason`; the
    request ended, so it is not an abort (it was counted as one when the engine's generator had
    not yet returned: a race that load made likely)."""
    engine = SyntheticEngine({"token_ms": 0})
    stream = engine.generate(_request("last", max_tokens=3))
    deltas = [await anext(stream) for _ in range(3)]
    assert deltas[-1].finish_reason == "length"
    await stream.aclose()
    s = engine.stats()
    assert (s.requests_total, s.running, s.aborted_total) == (1, 0, 0)
