"""vLLM's sampling extensions, sent the way its clients send them (the openai SDK's `extra_body`):
each field's effect asserted in a way that holds on any CPU (greedy references, forced tokens,
exact token counts), not by eyeballing samples."""

from __future__ import annotations

from typing import Any

import openai

from tests.conftest import CHAT_MODEL

PROMPT = "Once upon a time, in a land far away,"


def complete(client: openai.OpenAI, **kw: Any) -> str:
    extra = kw.pop("extra_body", None)
    kw.setdefault("max_tokens", 12)
    r = client.completions.create(model=CHAT_MODEL, prompt=PROMPT, extra_body=extra, **kw)
    return r.choices[0].text


def test_top_k_1_equals_greedy(client: openai.OpenAI) -> None:
    greedy = complete(client, temperature=0)
    for seed in (1, 2, 3):
        assert complete(client, temperature=1.5, seed=seed, extra_body={"top_k": 1}) == greedy
    # And off (0 and -1, vLLM's spellings) leaves a hot sampler hot.
    hot = {complete(client, temperature=1.5, seed=s, extra_body={"top_k": -1}) for s in (1, 2, 3)}
    assert hot != {greedy}
