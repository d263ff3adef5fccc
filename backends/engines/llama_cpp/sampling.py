"""llama.cpp sampling for one request: the sampler chain and grammars (log-probabilities: logprobs.py).

llama-cpp-python's own `Llama.generate` builds a fixed chain without logit bias or lazy grammars,
so the engine builds its own from llama.cpp's samplers:

    [mask] -> [grammar] -> logit_bias -> repetition penalty -> frequency/presence penalties
        -> greedy | (temperature -> min_p -> top_k -> top_p -> random draw)

The order is vLLM's (penalties before temperature; min_p, top_k and top_p on the tempered
distribution). A chain of only (repetition penalty ->) temperature -> draw, the default of an
OpenAI client, is drawn in NumPy instead, at a fraction of the chain's cost (tempered_draw.py).
The mask (`token_mask.py`: min_tokens, ignore_eos, bad_words, allowed_token_ids)
is written into the logits row itself. The repetition penalty is vLLM's: it covers the prompt and
the output, so its sampler is fed the prompt first; frequency and presence cover the output only.

A grammar checks every candidate against its rules, which over a 49k vocabulary costs several
times the model's own step. So, as llama.cpp's own `common_sampler` does, the token is first
drawn without the grammar and only checked against it; the grammar masks the whole distribution
(and the draw is repeated) only when that token does not fit. The result is the same
distribution, because masking commutes with the additive bias and penalties.

Temperature comes before top_p as in OpenAI's and vLLM's definition (the nucleus is taken from
the tempered distribution), and top_k before top_p as in vLLM (the nucleus of the k likeliest).
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaSampler
from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

from raygate.backends.engines import tool_calls
from raygate.backends.engines.llama_cpp import gbnf, int_range, tempered_draw
from raygate.backends.engines.llama_cpp.tempered_draw import TemperedDraw
from raygate.backends.engines.llama_cpp.token_mask import TokenMask
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import SamplingParams, ToolsSpec

BACKEND = "llama_cpp"
# Tokens the repetition penalties look back over (llama-cpp-python's default).
PENALTY_LAST_N = 64


class _Converter(SchemaConverter):
    """llama-cpp-python's converter, plus integer bounds (it leaves them as a TODO): see int_range."""

    def visit(self, schema: dict[str, Any], name: str) -> str:
        if schema.get("type") == "integer" and int_range.has_bounds(schema):
            lo, hi = int_range.bounds(schema)
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            rule = int_range.range_rule(lo, hi) + " space"
            return str(self._add_rule(rule_name, rule))  # type: ignore[no-untyped-call]
        return str(super().visit(schema, name))  # type: ignore[no-untyped-call]

    def format_grammar(self) -> str:
        """JSON strings hold no raw control characters; the converter's `char` rule allowed them
        (a raw newline inside a string made an answer that `json.loads` refuses)."""
        grammar = str(super().format_grammar())  # type: ignore[no-untyped-call]
        return grammar.replace('char ::= [^"\\\\] |', 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |', 1)


def _converter() -> SchemaConverter:
    return _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)  # type: ignore[no-untyped-call]


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
    `<tool_call>` trigger), or None. Raises a 400 for a schema, regex or choice list the
    converters cannot handle (a GBNF `grammar` is compiled, and refused, by llama.cpp itself)."""
    tool_calls.refuse_schema_with_tools(sampling, tools, BACKEND)
    if sampling.grammar is not None:
        return sampling.grammar, False
    if sampling.regex is not None:
        return gbnf.regex_grammar(sampling.regex), False
    if sampling.choice is not None:
        return gbnf.choice_grammar(sampling.choice), False
    use_tools = tool_calls.active(tools)
    try:
        if sampling.json_schema is not None:
            return _schema_grammar(sampling.json_schema), False
        if use_tools:
            assert tools is not None
            return _tool_grammar(tools), not tool_calls.forced(tools)
    except Exception as exc:  # the converter raises plain errors on schemas it cannot express
        param = "response_format" if sampling.json_schema is not None else "tools"
        raise BadRequestError(f"Cannot turn the JSON schema into a grammar: {exc}", param=param) from None
    return None


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class TokenSampler:
    """Draws the next token from one row of a context's logits; owns its llama.cpp samplers.

    The row is a batch index as `llama_get_logits_ith` takes it: -1 (the last) for the
    one-sequence engine, the sequence's own token in the shared batch for the batched one."""

    def __init__(
        self,
        chain: LlamaSampler,
        grammar: Any,
        n_vocab: int,
        mask: TokenMask | None = None,
        lazy_vocab: Any = None,
        plain: TemperedDraw | None = None,
    ) -> None:
        """`lazy_vocab`: the vocabulary, when `grammar` is lazy (waits for `<tool_call>`).
        `plain`: draws in the (then empty) chain's stead: no grammar, and only penalty,
        temperature and draw asked for (tempered_draw.py)."""
        self._chain = chain
        self._plain = plain
        self._grammar = grammar
        self._n_vocab = n_vocab
        self._mask = mask
        self._history: list[int] = []  # what this sampler drew: the mask's rules look back on it
        self._vocab = lazy_vocab
        # The text so far while a lazy grammar waits for its trigger (llama.cpp's own buffer).
        self._awaiting: bytes | None = b"" if lazy_vocab is not None else None
        self._cur: Any = None  # `_draw`'s candidate array, made on its first use
        if grammar is not None:
            self._one = (llama_cpp.llama_token_data * 1)()
        # A reasoning model's thinking (backends/engines/reasoning.py): while it thinks the
        # grammar sleeps and an end of generation becomes the end marker (`think`), until the
        # answer begins (`arm`); a spent thinking budget forces the end marker (`force`).
        self._dormant = False
        self._thinking: tuple[list[int], Callable[[int], bool]] | None = None
        self._forced: list[int] = []

    def think(self, end_tokens: list[int], is_eog: Callable[[int], bool]) -> None:
        """The sequence begins in thinking: the output constraint applies to the answer only, and
        the model may not end its turn before it has answered: an end-of-generation token drawn
        while thinking is replaced by the end marker (`end_tokens`)."""
        self._dormant = self._grammar is not None
        self._thinking = (end_tokens, is_eog)

    def arm(self) -> None:
        """The answer begins: from the next token on, the grammar constrains it."""
        self._dormant = False
        self._thinking = None

    def force(self, tokens: list[int]) -> None:
        """The next draws return these tokens, whatever the logits say (a thinking budget spent).
        Not while an end marker is already on its way (an end of generation replaced by it): a
        multi-token one (gpt-oss's) would be written twice."""
        if not self._forced:
            self._forced.extend(tokens)

    def sample(self, ctx: Any, row: int = -1, kept: np.ndarray | None = None) -> int:
        """`ctx`: the raw `llama_context` pointer. `kept`: logits to draw from instead of the
        row (a prompt's last position, kept by the prompt cache); left as they were."""
        if self._forced:
            token = self._forced.pop(0)
            llama_cpp.llama_sampler_accept(self._chain.sampler, token)
            if self._plain is not None:
                self._plain.accept(token)
            if self._mask is not None:
                self._history.append(token)
            return token
        token = self._next(ctx, row, kept)
        if self._thinking is not None and self._thinking[1](token):
            end = self._thinking[0]
            self._forced = end[1:]
            self._thinking = None  # once: the marker is on its way
            return end[0]
        return token

    def _next(self, ctx: Any, row: int, kept: np.ndarray | None) -> int:
        logits = kept
        if logits is None and (self._mask is not None or self._grammar_on or self._plain is not None):
            ptr = llama_cpp.llama_get_logits_ith(ctx, row)
            logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))
        if logits is None:  # the common case: llama.cpp's chain reads the row itself
            return int(llama_cpp.llama_sampler_sample(self._chain.sampler, ctx, row))
        if self._mask is None:
            return self._sample(logits, ctx, row, kept is not None)
        self._mask.apply(logits, self._history)
        try:
            token = self._sample(logits, ctx, row, kept is not None)
        finally:
            self._mask.undo(logits)
        self._history.append(token)
        return token

    @property
    def _grammar_on(self) -> bool:
        return self._grammar is not None and not self._dormant

    def _sample(self, logits: np.ndarray, ctx: Any, row: int, kept: bool) -> int:
        if self._plain is not None:
            return self._plain.draw(logits)
        if not self._grammar_on:
            if not kept:  # the row, masked in place
                return int(llama_cpp.llama_sampler_sample(self._chain.sampler, ctx, row))
            token = self._draw(logits, masked=False)
        else:
            token = self._draw(logits, masked=False)
            if not self._fits(token):
                token = self._draw(logits, masked=True)
            if self._awaiting is not None:
                token = self._trigger_safely(logits, token)
            llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain.sampler, token)
        return token

    def _trigger_safely(self, logits: np.ndarray, token: int) -> int:
        """`token`, or another draw if `token` would wake the lazy grammar with text it rejects.

        When the text so far comes to hold `<tool_call>`, llama.cpp hands the grammar everything
        from there on, and a grammar that rejects it throws a C++ exception, which aborts the
        whole process (a token such as `>.` closing the tag; seen in the test suite). While it is
        still waiting, the grammar cannot tell beforehand: it lets every token through. So every
        token that would wake it that way is banned at once (the vocabulary's pieces are read
        only then: rare, ~0.1 s) and the draw repeated, which can then only be safe."""
        assert self._awaiting is not None
        text = self._awaiting + self._piece(token)
        safe = tool_calls.trigger_is_safe(text)
        if safe is None:  # no trigger yet
            self._awaiting = text
            return token
        if not safe:
            tail = self._awaiting[-len(tool_calls.OPEN) :]  # all that a token can complete the tag with
            banned = [
                t for t in range(self._n_vocab) if tool_calls.trigger_is_safe(tail + self._piece(t)) is False
            ]
            token = self._draw(logits, masked=False, banned=banned)
            if tool_calls.trigger_is_safe(tail + self._piece(token)) is None:
                self._awaiting += self._piece(token)
                return token
        self._awaiting = None  # awake: from now on the grammar itself checks every token
        return token

    def _piece(self, token: int) -> bytes:
        """The token's text as llama.cpp's grammar sees it (special tokens rendered)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def _draw(self, logits: np.ndarray, masked: bool, banned: list[int] | None = None) -> int:
        if self._cur is None:
            self._cur = (llama_cpp.llama_token_data * self._n_vocab)()
            self._view = np.frombuffer(self._cur, dtype=_TOKEN_DATA)
            self._ids = np.arange(self._n_vocab, dtype=np.int32)
        # Samplers sort and shrink the array in place: refill it every time.
        self._view["id"] = self._ids
        self._view["logit"] = logits
        if banned:
            self._view["logit"][banned] = -np.inf
        self._view["p"] = 0.0
        cur = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self._cur, llama_cpp.llama_token_data_p),
            size=self._n_vocab,
            selected=-1,
            sorted=False,
        )
        if masked:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(cur))
        llama_cpp.llama_sampler_apply(self._chain.sampler, ctypes.byref(cur))
        if not 0 <= cur.selected < cur.size:
            raise RuntimeError("the sampler chain selected no token")
        return int(cur.data[cur.selected].id)

    def _fits(self, token: int) -> bool:
        self._one[0].id, self._one[0].logit, self._one[0].p = token, 1.0, 0.0  # type: ignore[assignment]
        one = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self._one, llama_cpp.llama_token_data_p), size=1, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(one))
        return bool(np.isfinite(one.data[0].logit))

    def close(self) -> None:
        """Idempotent; also runs on garbage collection (a request cancelled while its sampler
        was being built never reaches the decode loop that normally closes it)."""
        self._chain.close()
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None

    __del__ = close


def _repetition_penalty(
    sampler: LlamaSampler, n_vocab: int, penalty: float, prompt: list[int], window: int
) -> None:
    """vLLM's repetition penalty: over the prompt and the output (the sampler is told the prompt
    before it joins the chain, which then feeds it each drawn token)."""
    one = llama_cpp.llama_sampler_init_penalties(n_vocab, window, penalty, 0.0, 0.0)
    for token in prompt[-window:]:
        llama_cpp.llama_sampler_accept(one, token)
    llama_cpp.llama_sampler_chain_add(sampler.sampler, one)


def build_sampler(
    llm: Any,
    sampling: SamplingParams,
    tools: ToolsSpec | None,
    seed: int,
    prompt: list[int] | None = None,
    context_length: int = 0,
) -> TokenSampler:
    """`prompt`: the request's prompt tokens, which the repetition penalty covers, as far back as
    `context_length` (the engine's, not `llm`'s: the batched engine's `Llama` has a tiny one)."""
    n_vocab = llm.n_vocab()
    grammar = grammar_for(sampling, tools)
    mask = TokenMask.build(llm, sampling, grammar_ends=grammar is not None)
    vocab = llm._model.vocab
    chain = LlamaSampler()
    window = context_length or len(prompt or []) + (sampling.max_tokens or 0) or 1
    if grammar is None and tempered_draw.applies(sampling):  # the chain stays empty
        plain = TemperedDraw(n_vocab, sampling.temperature, seed, sampling.repetition_penalty, prompt, window)
        return TokenSampler(chain, None, n_vocab, mask, plain=plain)
    if sampling.logit_bias:
        bad = [t for t in sampling.logit_bias if not 0 <= t < n_vocab]
        if bad:
            raise BadRequestError(
                f"`logit_bias` names token {bad[0]}; this model's token ids are 0..{n_vocab - 1}.",
                param="logit_bias",
            )
        chain.add_logit_bias(n_vocab, sampling.logit_bias)
    if sampling.repetition_penalty != 1.0:
        _repetition_penalty(chain, n_vocab, sampling.repetition_penalty, prompt or [], window)
    if sampling.presence_penalty or sampling.frequency_penalty:
        chain.add_penalties(
            n_vocab, PENALTY_LAST_N, 1.0, sampling.frequency_penalty, sampling.presence_penalty
        )
    if sampling.temperature == 0:
        chain.add_greedy()
    else:
        chain.add_temp(sampling.temperature)
        if sampling.min_p > 0:
            chain.add_min_p(sampling.min_p, 1)
        if sampling.top_k_limit is not None:
            chain.add_top_k(sampling.top_k_limit)
        chain.add_top_p(sampling.top_p, 1)
        chain.add_dist(seed)
    if grammar is None:
        return TokenSampler(chain, None, n_vocab, mask)
    text, lazy = grammar
    if lazy:
        patterns = (ctypes.c_char_p * 1)(tool_calls.TRIGGER_PATTERN.encode())
        no_tokens = (llama_cpp.llama_token * 0)()
        sampler = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            vocab, text.encode(), b"root", patterns, 1, no_tokens, 0
        )
    else:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
    if not sampler:  # NULL: llama.cpp could not parse the grammar (it logs why)
        chain.close()
        raise BadRequestError(
            "llama.cpp could not compile the grammar for this request.",
            param=tool_calls.constraint_param(sampling) if sampling.constrained else "tools",
        )
    return TokenSampler(chain, sampler, n_vocab, mask, lazy_vocab=vocab if lazy else None)
