"""The bench client's request bodies: where a unique prompt's number goes decides what a prompt
cache can reuse, so the scenarios against llama-server compare what they say they compare."""

from __future__ import annotations

import json

from bench import plan
from bench.client import Workload


def _prompts(workload: str, n: int = 2) -> list[str]:
    body = plan.WORKLOADS[workload]
    make = Workload("/completions", body, plan.OUTPUT_TOKENS, workload in plan.UNIQUE).payloads()
    return [json.loads(make())["prompt"] for _ in range(n)]


def test_new_prompts_differ_from_their_first_token() -> None:
    a, b = _prompts("llama-unique")
    assert a != b and a.split(".", 1)[0] != b.split(".", 1)[0]
    assert a.split(". ", 1)[1] == b.split(". ", 1)[1] == plan.LLAMA_PROMPT


def test_a_shared_opening_then_a_new_question() -> None:
    a, b = _prompts("llama-shared-new")
    opening = plan.SHARED_OPENING + "\n\n"
    assert a.startswith(opening) and b.startswith(opening) and a != b
    assert a.endswith(plan.LLAMA_PROMPT) and b.endswith(plan.LLAMA_PROMPT)
    assert "{n}" not in a + b


def test_a_repeated_prompt_is_the_same_every_time() -> None:
    a, b = _prompts("llama-shared")
    assert a == b == plan.SHARED_OPENING + "\n\n" + plan.LLAMA_PROMPT


def test_lengths_drawn_from_a_range_the_same_on_every_run() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 32}
    runs = [
        Workload("/chat/completions", body, unique=True, max_tokens_between=(16, 48)).payloads() for _ in "ab"
    ]
    drawn = [[json.loads(make())["max_tokens"] for _ in range(200)] for make in runs]
    assert drawn[0] == drawn[1] and all(16 <= n <= 48 for n in drawn[0])
    assert len(set(drawn[0])) > 20 and 28 <= sum(drawn[0]) / 200 <= 36
