"""How much of a cached prefix a prompt may reuse: the rule both llama.cpp engines' prompt caches
share (`REEVALUATED`), and the one-sequence engine's prefill that applies it."""

from __future__ import annotations

from typing import Any

# Prompt tokens evaluated again even when the KV cache holds them (see `prefill`).
REEVALUATED = 2


def prefill(llm: Any, tokens: list[int], reuse: bool = True) -> int:
    """Evaluate the prompt, reusing the KV cache of the longest prefix shared with the previous
    request (as `Llama.generate` does) unless `reuse` is off.

    At least `REEVALUATED` tokens are evaluated again: llama.cpp evaluates a lone token with other
    kernels than a batch, and its logits differ by up to 0.66 here (SmolLM2 Q8, measured), enough
    to flip a greedy answer between a fresh prompt and the same prompt served from the cache.
    Returns how many prompt tokens came from the cache."""
    cached = llm.input_ids[: llm.n_tokens] if reuse else []
    shared = 0
    for a, b in zip(cached, tokens, strict=False):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(tokens) - REEVALUATED)
    if shared > 0 and llm._ctx.kv_cache_seq_rm(-1, shared, -1):
        llm.n_tokens = shared
    else:
        llm.reset()
    reused: int = llm.n_tokens
    llm.eval(tokens[reused:])
    return reused
