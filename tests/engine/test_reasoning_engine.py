"""A reasoning model on both llama.cpp engines, in-process: `tiny-reasoner` (tests/support/reasoning.py),
whose template opens `<think>` in the prompt. The split, the budget forcing `</think>`, the end of a
turn turned into the end marker while thinking, thinking off, and the grammar held until the answer,
the same on the one-sequence and the batched engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.protocol.capabilities import ReasoningConfig
from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import ChatMessage, Delta, GenerateRequest, SamplingParams
from raygate.protocol.model_source import ModelSource
from tests.support.reasoning import tiny_reasoner

QUESTION = [ChatMessage("user", "What is 2+2?")]


async def _engine(**engine: object) -> Engine:
    config = ModelConfig(
        name="r",
        source=ModelSource(path=tiny_reasoner()),
        engine={"n_threads": 1, "n_ctx": 1024, **engine},
        reasoning=ReasoningConfig(),
    )
    e = make_engine(config)
    await e.start()
    return e


@pytest.fixture(scope="module", params=[1, 4], ids=["single", "batched"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    yield await _engine(n_seq_max=request.param)


async def run(engine: Engine, req: GenerateRequest) -> tuple[str, str, Delta]:
    thought, answer, last = "", "", None
    async for delta in engine.generate(req):
        thought, answer, last = thought + delta.reasoning, answer + delta.text, delta
    assert last is not None and last.finish_reason is not None
    return thought, answer, last


def chat(max_tokens: int, **kw: object) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, min_tokens=int(kw.pop("min_tokens", 0)))  # type: ignore[call-overload]
    if "json_schema" in kw:
        sampling.json_schema = kw.pop("json_schema")  # type: ignore[assignment]
    return GenerateRequest("r", sampling, messages=QUESTION, **kw)  # type: ignore[arg-type]


async def test_budget_forces_the_end_marker(engine: Engine) -> None:
    thought, answer, last = await run(engine, chat(12, thinking_budget=3, min_tokens=12))
    assert thought and answer
    assert "think>" not in thought + answer
    assert last.reasoning_tokens == 4  # three thinking tokens and the forced marker
    assert last.completion_tokens == 12 and last.finish_reason == "length"


async def test_an_end_of_turn_while_thinking_becomes_the_end_marker(engine: Engine) -> None:
    """Unbounded, the model ends its thought with an end-of-generation token; the engine writes
    `</think>` instead (its token is in the output), so the turn goes on to an answer."""
    req = chat(64)
    req.sampling.logprobs = 0
    tokens: list[str] = []
    thought, last = "", None
    async for delta in engine.generate(req):
        thought, last = thought + delta.reasoning, delta
        tokens += [t.token for t in delta.logprobs or ()]
    assert last is not None and last.finish_reason == "stop"
    assert thought and "</think>" in tokens
    assert last.reasoning_tokens == tokens.index("</think>") + 1


async def test_thinking_off_has_no_thinking(engine: Engine) -> None:
    thought, answer, last = await run(engine, chat(8, thinking=False, min_tokens=2))
    assert thought == "" and answer and last.reasoning_tokens == 0


async def test_no_end_marker_before_max_tokens(engine: Engine) -> None:
    thought, answer, last = await run(engine, chat(4, min_tokens=4))
    assert thought and answer == "" and last.reasoning_tokens == 4 and last.finish_reason == "length"


async def test_the_grammar_constrains_the_answer_not_the_thinking(engine: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"enum": [1, 2]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    thought, answer, last = await run(engine, chat(40, thinking_budget=3, json_schema=schema))
    assert not thought.lstrip().startswith("{")
    assert json.loads(answer) in ({"a": 1}, {"a": 2})
    assert last.reasoning_tokens == 4


async def test_both_engines_agree() -> None:
    single, batched = await _engine(), await _engine(n_seq_max=4)
    for req in (chat(12, thinking_budget=3, min_tokens=12), chat(6, thinking=False), chat(30)):
        a, b = await run(single, req), await run(batched, req)
        assert a[:2] == b[:2] and a[2].reasoning_tokens == b[2].reasoning_tokens


async def test_a_zero_budget_ends_the_thinking_at_once(engine: Engine) -> None:
    thought, answer, last = await run(engine, chat(6, thinking_budget=0, min_tokens=6))
    assert thought == "" and answer and last.reasoning_tokens == 1  # the forced marker alone
