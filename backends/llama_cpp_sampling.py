"""llama.cpp sampling for one request: the sampler chain, grammars, and log-probabilities.

llama-cpp-python's own `Llama.generate` builds a fixed chain without logit bias or lazy grammars,
so the engine builds its own from llama.cpp's samplers:

    logit_bias -> penalties -> grammar -> greedy | (temperature -> top_p -> random draw)

Temperature comes before top_p as in OpenAI's and vLLM's definition (the nucleus is taken from
the tempered distribution). Reported logprobs are the model's raw distribution at each step
(before bias, penalties, grammar and temperature), as vLLM reports them by default.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaSampler
from llama_cpp.llama_grammar import SchemaConverter

from backends import tool_calls
from protocol.errors import BadRequestError, UnsupportedParameterError
from protocol.generation import SamplingParams, TokenLogprob, ToolsSpec, TopLogprob

BACKEND = "llama_cpp"
# Tokens the repetition penalties look back over (llama-cpp-python's default).
PENALTY_LAST_N = 64


def _converter() -> SchemaConverter:
    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _schema_grammar(schema: dict[str, Any]) -> str:
    conv = _converter()
    conv.visit(conv.resolve_refs(schema, "request"), "")
    return str(conv.format_grammar())


def _tool_grammar(tools: ToolsSpec) -> str:
    """`<tool_call>` blocks whose JSON is a call to one of the offered tools: one block, or
    several separated by newlines when parallel calls are allowed."""
    conv = _converter()
    call = conv.visit(conv.resolve_refs(tool_calls.call_schema(tools.offered()), "tools"), "tool-call")
    open_, close = json.dumps(tool_calls.OPEN + "\n"), json.dumps("\n" + tool_calls.CLOSE)
    block = conv._add_rule("tool-call-block", f"{open_} {call} {close}")
    conv._add_rule("root", f"{block}+" if tools.parallel else block)
    return str(conv.format_grammar())


def grammar_for(sampling: SamplingParams, tools: ToolsSpec | None) -> tuple[str, bool] | None:
    """The GBNF grammar constraining this request and whether it is lazy (waits for the
    `<tool_call>` trigger), or None. Raises a 400 for a schema the converter cannot handle."""
    use_tools = tool_calls.active(tools)
    if sampling.json_schema is not None and use_tools:
        raise UnsupportedParameterError(
            f"`response_format` together with `tools` is not supported by the {BACKEND} backend "
            "(set `tool_choice: none`, or drop one of them).",
            param="response_format",
        )
    try:
        if sampling.json_schema is not None:
            return _schema_grammar(sampling.json_schema), False
        if use_tools:
            assert tools is not None
            return _tool_grammar(tools), not tool_calls.forced(tools)
    except Exception as exc:  # the converter raises plain errors on schemas it cannot express
        param = "response_format" if sampling.json_schema is not None else "tools"
        raise BadRequestError(f"Cannot turn the JSON schema into a grammar: {exc}", param=param)
    return None


def _add(chain: LlamaSampler, sampler: Any, what: str, param: str) -> None:
    """llama.cpp returns NULL for a grammar it cannot parse; adding NULL would crash the process."""
    if not sampler:
        raise BadRequestError(f"llama.cpp could not compile the {what}.", param=param)
    llama_cpp.llama_sampler_chain_add(chain.sampler, sampler)


def build_sampler(
    llm: Any, sampling: SamplingParams, tools: ToolsSpec | None, seed: int
) -> LlamaSampler:
    n_vocab = llm.n_vocab()
    vocab = llm._model.vocab
    chain = LlamaSampler()
    if sampling.logit_bias:
        bad = [t for t in sampling.logit_bias if not 0 <= t < n_vocab]
        if bad:
            raise BadRequestError(
                f"`logit_bias` names token {bad[0]}; this model's token ids are 0..{n_vocab - 1}.",
                param="logit_bias",
            )
        chain.add_logit_bias(n_vocab, sampling.logit_bias)
    if sampling.presence_penalty or sampling.frequency_penalty:
        chain.add_penalties(
            n_vocab, PENALTY_LAST_N, 1.0, sampling.frequency_penalty, sampling.presence_penalty
        )
    grammar = grammar_for(sampling, tools)
    if grammar is not None:
        text, lazy = grammar
        param = "response_format" if sampling.json_schema is not None else "tools"
        if lazy:
            patterns = (ctypes.c_char_p * 1)(tool_calls.TRIGGER_PATTERN.encode())
            no_tokens = (llama_cpp.llama_token * 0)()
            sampler = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                vocab, text.encode(), b"root", patterns, 1, no_tokens, 0
            )
        else:
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        _add(chain, sampler, "grammar", param)
    if sampling.temperature == 0:
        chain.add_greedy()
    else:
        chain.add_temp(sampling.temperature)
        chain.add_top_p(sampling.top_p, 1)
        chain.add_dist(seed)
    return chain


# -- log-probabilities --------------------------------------------------------------------------


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    shifted = x - x.max()
    return np.asarray(shifted - np.log(np.exp(shifted).sum()))


def _piece(llm: Any, token: int) -> tuple[str, bytes]:
    raw = bytes(llm._model.detokenize([token], special=True))
    return raw.decode("utf-8", errors="replace"), raw


def logprob_at(llm: Any, row: int, token: int, top: int) -> TokenLogprob:
    """`token`'s logprob under the logits of output `row` (-1: the last), and the `top` likeliest.

    Values are converted to Python floats here: numpy scalars do not pickle across Ray cheaply
    and do not serialise to JSON at all.
    """
    n_vocab = llm.n_vocab()
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, row), shape=(n_vocab,))
    lp = _log_softmax(logits)
    alternatives: list[TopLogprob] = []
    if top > 0:
        best = np.argpartition(-lp, top)[:top]
        for t in best[np.argsort(-lp[best])]:
            text, raw = _piece(llm, int(t))
            alternatives.append(TopLogprob(text, raw, float(lp[t])))
    text, raw = _piece(llm, token)
    return TokenLogprob(text, raw, float(lp[token]), alternatives)


def eval_prompt_with_logprobs(llm: Any, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Evaluate the whole prompt keeping every position's logits (llama-cpp-python keeps only the
    last unless the model was loaded with `logits_all`), and score each prompt token.

    Mirrors `Llama.eval`'s bookkeeping so later `eval` calls and prefix reuse stay correct.
    """
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    text, raw = _piece(llm, tokens[0])
    scored = [TokenLogprob(text, raw, None)]
    n_past = 0
    for start in range(0, len(tokens), llm.n_batch):
        chunk = tokens[start : start + llm.n_batch]
        llm._batch.set_batch(batch=chunk, n_past=n_past, logits_all=True)
        llm._ctx.decode(llm._batch)
        llm.input_ids[n_past : n_past + len(chunk)] = chunk
        for row in range(len(chunk)):
            nxt = n_past + row + 1
            if nxt < len(tokens):
                scored.append(logprob_at(llm, row, tokens[nxt], top))
        n_past += len(chunk)
        llm.n_tokens = n_past
    return scored


def prefill(llm: Any, tokens: list[int]) -> None:
    """Evaluate the prompt, reusing the KV cache of the longest prefix shared with the previous
    request (as `Llama.generate` does). At least one token is always evaluated, so the logits to
    sample from belong to this prompt."""
    cached = llm.input_ids[: llm.n_tokens]
    shared = 0
    for a, b in zip(cached, tokens):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(tokens) - 1)
    if shared > 0 and llm._ctx.kv_cache_seq_rm(-1, shared, -1):
        llm.n_tokens = shared
    else:
        llm.reset()
    llm.eval(tokens[llm.n_tokens :])
