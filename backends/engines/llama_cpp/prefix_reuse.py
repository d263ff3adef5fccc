"""How much of a cached prefix a prompt may reuse: the rule both llama.cpp engines' prompt caches
share (`reevaluated_tokens`), and the one-sequence engine's prefill that applies it."""

from __future__ import annotations

from typing import Any

from raygate.backends.engines.base import EngineStats

# Prompt tokens evaluated again when the KV cache holds the whole prompt, unless the model passes
# `reevaluated_tokens`' check (then one, as llama-server does).
REEVALUATED = 2
# The check's prompt (19 tokens), cut at several lengths: which code a batch takes depends on its
# size (without flash attention, a lone last token got other logits than the whole prompt of 2,
# 9, 10, 13 and 18 of these tokens with SmolLM2 Q4_1, of 3, 5, 12 and 17 with Q8_0; the same at
# the other lengths). Under the 64-token context of the batched engine's tokenizer `Llama`, which
# the check runs on.
_PROBE = "A prompt cache keeps what a prompt shares with the one before it, and evaluates the rest."
_PROBE_LENGTHS = (2, 3, 5, 9, 13, 16, 19)


def reevaluated_tokens(llm: Any) -> int:
    """How many prompt tokens to evaluate again when the cache holds them all: 1 if llama.cpp
    gives a prompt's last token, evaluated alone after the cached rest, the very logits it gets
    evaluated with the tokens before it; `REEVALUATED` if not.

    Why check: a lone token may take other code than a batch; without flash attention its logits
    differed (by up to 0.73 for SmolLM2, measured) at many prompt lengths, enough to flip a greedy
    answer between a fresh prompt and the same prompt served from the cache, while a two-token
    tail matched. With flash attention and a V cache unlike K (the generation defaults: every
    batch takes the row-by-row kernel) they were equal at every length from 2 to 54, and one token
    less is a decode step less on every cache hit (~5 of the 17 ms a repeated prompt's first
    token took in-process on 2 cores). Kernels are chosen by weight type, batch size and
    settings, not by the text, so prompts of several lengths answer for the model.
    Blocking (~60 tokens' decodes); leaves the context empty."""
    tokens = llm.tokenize(_PROBE.encode())
    try:
        for n in _PROBE_LENGTHS:
            whole = last_logits(llm, tokens[:n], tail=n)
            llm.n_tokens = n - 1  # `eval` drops the last token's cells and decodes it alone
            llm.eval(tokens[n - 1 : n])
            if _logits(llm) != whole:
                return REEVALUATED
        return 1
    finally:
        _empty(llm)


def last_logits(llm: Any, tokens: list[int], tail: int) -> list[float]:
    """The last token's logits with the prompt evaluated in two decodes, the last `tail` tokens
    in the second (the prompt cache's case; `tail=len(tokens)`: one decode). Leaves the prompt's
    cells in the context."""
    _empty(llm)
    if len(tokens) > tail:
        llm.eval(tokens[:-tail])
    llm.eval(tokens[-tail:])
    return _logits(llm)


def _logits(llm: Any) -> list[float]:
    import llama_cpp

    return llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)[: llm.n_vocab()]  # type: ignore[no-any-return]


def _empty(llm: Any) -> None:
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)


def prefill(llm: Any, tokens: list[int], reevaluated: int, stats: EngineStats, reuse: bool = True) -> int:
    """Evaluate the prompt, reusing the KV cache of the longest prefix shared with the previous
    request (as `Llama.generate` does) unless `reuse` is off; at least `reevaluated` tokens
    (`reevaluated_tokens`) are evaluated again, `Llama.eval`'s `n_batch` at a time (counted in
    `stats`). Returns how many prompt tokens came from the cache."""
    cached = llm.input_ids[: llm.n_tokens] if reuse else []
    shared = 0
    for a, b in zip(cached, tokens, strict=False):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(tokens) - reevaluated)
    if shared > 0 and llm._ctx.kv_cache_seq_rm(-1, shared, -1):
        llm.n_tokens = shared
    else:
        llm.reset()
    reused: int = llm.n_tokens
    todo = len(tokens) - reused
    with stats.forward(todo, passes=-(-todo // llm.n_batch)):
        llm.eval(tokens[reused:])
    return reused
