"""Tokens a request forbids at a step, with vLLM's rules, for the llama.cpp sampler.

vLLM's `min_tokens`, `ignore_eos`, `bad_words` and `allowed_token_ids` are logits processors: they
set some logits to -inf before the draw. llama.cpp has no sampler for them (its logit-bias sampler
is fixed for the whole request, and `bad_words` depends on what was generated), so the mask is
written into the context's logits row in place and undone right after the draw: the reported
logprobs stay the model's raw distribution, as vLLM reports them.

* `min_tokens`: end-of-generation tokens and `stop_token_ids` are banned until that many tokens
  were generated.
* `ignore_eos`: end-of-generation tokens are banned for the whole request (as llama-server does),
  so only the token budget or a stop condition ends it.
* `bad_words`: each word is tokenized with and without a leading space (vLLM's rule); a word's
  last token is banned where the output so far ends with the word's other tokens.
* `allowed_token_ids`: every other token is banned.

Under a grammar (an output constraint, tool calls) the end-of-generation tokens are never banned:
once the grammar is complete they are the only tokens it allows, and banning them would leave
nothing to draw. There the grammar decides where the output ends.
"""

from __future__ import annotations

import weakref
from typing import Any

import llama_cpp
import numpy as np

from raygate.backends.engines.base import check_token_ids
from raygate.protocol.generation import SamplingParams

_END_IDS: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


def end_of_generation_ids(llm: Any) -> list[int]:
    """Every token llama.cpp treats as end of generation (EOS, EOT, <|im_end|> ...), per model."""
    ids = _END_IDS.get(llm)
    if ids is None:
        vocab = llm._model.vocab
        ids = _END_IDS[llm] = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    return ids


def bad_word_sequences(llm: Any, words: list[str]) -> list[list[int]]:
    """vLLM's tokenization of `bad_words`: the word as is, and after a space when that spells it
    with other tokens of the same count (a word inside a sentence)."""
    out: list[list[int]] = []
    for word in words:
        bare = list(llm.tokenize(word.lstrip().encode(), add_bos=False, special=False))
        spaced = list(llm.tokenize((" " + word.lstrip()).encode(), add_bos=False, special=False))
        for seq in (bare, spaced):
            if seq and seq not in out and (seq is bare or (seq[0] != bare[0] and len(seq) == len(bare))):
                out.append(seq)
    return out


class TokenMask:
    """Applies a request's bans to one logits row before a draw, and undoes them after."""

    def __init__(
        self,
        n_vocab: int,
        *,
        ends: list[int],
        min_tokens: int,
        always: list[int],
        bad_words: list[list[int]],
        allowed: list[int] | None,
    ) -> None:
        self._ends = np.array(ends, dtype=np.int64)
        self._min_tokens = min_tokens
        self._always = np.array(always, dtype=np.int64)
        self._bad_words = bad_words
        self._allowed = np.array(sorted(set(allowed)), dtype=np.int64) if allowed is not None else None
        self._n_vocab = n_vocab
        self._saved: np.ndarray | None = None
        self._ids: np.ndarray | None = None

    @classmethod
    def build(cls, llm: Any, sampling: SamplingParams, grammar_ends: bool = False) -> TokenMask | None:
        """The mask `sampling` asks for, or None when it asks for none (the common case costs
        nothing per token). `grammar_ends`: a grammar constrains the output (see above)."""
        n_vocab = llm.n_vocab()
        check_token_ids(sampling.stop_token_ids, n_vocab, "stop_token_ids")
        if sampling.allowed_token_ids is not None:
            check_token_ids(sampling.allowed_token_ids, n_vocab, "allowed_token_ids")
        if not (
            sampling.min_tokens
            or sampling.ignore_eos
            or sampling.bad_words
            or sampling.allowed_token_ids is not None
        ):
            return None
        eog = [] if grammar_ends else end_of_generation_ids(llm)
        return cls(
            n_vocab,
            ends=[*eog, *sampling.stop_token_ids],
            min_tokens=sampling.min_tokens,
            always=eog if sampling.ignore_eos else [],
            bad_words=bad_word_sequences(llm, sampling.bad_words),
            allowed=sampling.allowed_token_ids,
        )

    def _banned(self, history: list[int]) -> np.ndarray:
        parts = [self._always]
        if len(history) < self._min_tokens:
            parts.append(self._ends)
        for seq in self._bad_words:
            *head, last = seq
            if not head or history[-len(head) :] == head:
                parts.append(np.array([last], dtype=np.int64))
        return np.concatenate(parts)

    def apply(self, logits: np.ndarray, history: list[int]) -> None:
        """Ban in place; `history`: the tokens this sequence generated so far."""
        if self._allowed is not None:
            self._saved, self._ids = logits.copy(), None
            kept = logits[self._allowed]
            logits[:] = -np.inf
            logits[self._allowed] = kept
        banned = self._banned(history)
        if self._allowed is None:
            self._ids = banned
            self._saved = logits[banned].copy()
        logits[banned] = -np.inf

    def undo(self, logits: np.ndarray) -> None:
        if self._saved is None:
            return
        if self._ids is None:
            logits[:] = self._saved
        else:
            logits[self._ids] = self._saved
        self._saved = self._ids = None
