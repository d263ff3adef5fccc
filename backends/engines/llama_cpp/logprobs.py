"""Log-probabilities from llama.cpp's logits: of each sampled token (`logprobs`/`top_logprobs`)
and of each prompt token (completions `echo` + `logprobs`), for both llama.cpp engines.

Reported values are the model's raw distribution at each step (before bias, penalties, grammar
and temperature), as vLLM reports them by default.
"""

from __future__ import annotations

from typing import Any

import llama_cpp
import numpy as np

from raygate.backends.engines.base import EngineStats
from raygate.protocol.generation import TokenLogprob, TopLogprob


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    shifted = x - x.max()
    return np.asarray(shifted - np.log(np.exp(shifted).sum()))


def _piece(llm: Any, token: int) -> tuple[str, bytes]:
    raw = bytes(llm._model.detokenize([token], special=True))
    return raw.decode("utf-8", errors="replace"), raw


def logprob_at(
    llm: Any, ctx: Any, row: int, token: int, top: int, kept: np.ndarray | None = None
) -> TokenLogprob:
    """`token`'s logprob under the logits of batch index `row` (-1: the last) of `ctx` (the raw
    `llama_context` pointer), or under `kept` (logits the prompt cache kept), and the `top`
    likeliest. `llm` only supplies the vocabulary.

    Values are converted to Python floats here: numpy scalars do not pickle across Ray cheaply
    and do not serialise to JSON at all.
    """
    n_vocab = llm.n_vocab()
    if kept is None:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, row), shape=(n_vocab,))
    else:
        logits = kept
    lp = _log_softmax(logits)
    alternatives: list[TopLogprob] = []
    if top > 0:
        best = np.argpartition(-lp, top)[:top]
        for t in best[np.argsort(-lp[best])]:
            text, raw = _piece(llm, int(t))
            alternatives.append(TopLogprob(text, raw, float(lp[t])))
    text, raw = _piece(llm, token)
    return TokenLogprob(text, raw, float(lp[token]), alternatives)


def unpredicted(llm: Any, token: int) -> TokenLogprob:
    """The entry of the first prompt token, which nothing predicts (`logprob` None, as at OpenAI)."""
    text, raw = _piece(llm, token)
    return TokenLogprob(text, raw, None)


def score_prompt_chunk(
    llm: Any, ctx: Any, tokens: list[int], start: int, first_row: int, n: int, top: int
) -> list[TokenLogprob]:
    """Score the prompt tokens that positions `start .. start+n-1` predict, from their logits at
    batch indices `first_row ..` of `ctx` (decoded with logits requested for every one of them).
    The last prompt position predicts nothing: its logits are the first sample's."""
    return [
        logprob_at(llm, ctx, first_row + k, tokens[start + k + 1], top)
        for k in range(n)
        if start + k + 1 < len(tokens)
    ]


def eval_prompt_with_logprobs(
    llm: Any, tokens: list[int], top: int, stats: EngineStats
) -> list[TokenLogprob]:
    """Evaluate the whole prompt keeping every position's logits (llama-cpp-python keeps only the
    last unless the model was loaded with `logits_all`), and score each prompt token.

    Mirrors `Llama.eval`'s bookkeeping so later `eval` calls and prefix reuse stay correct.
    """
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    scored = [unpredicted(llm, tokens[0])]
    n_past = 0
    for start in range(0, len(tokens), llm.n_batch):
        chunk = tokens[start : start + llm.n_batch]
        llm._batch.set_batch(batch=chunk, n_past=n_past, logits_all=True)
        with stats.forward(len(chunk)):
            llm._ctx.decode(llm._batch)
        llm.input_ids[n_past : n_past + len(chunk)] = chunk
        scored += score_prompt_chunk(llm, llm._ctx.ctx, tokens, n_past, 0, len(chunk), top)
        n_past += len(chunk)
        llm.n_tokens = n_past
    return scored
