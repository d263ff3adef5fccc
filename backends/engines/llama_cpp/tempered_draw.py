"""The sampler chain's commonest case drawn in NumPy: (repetition penalty ->) temperature -> draw.

A request with a temperature and nothing that cuts the vocabulary (no top_k, top_p < 1, min_p,
logit_bias, frequency/presence penalty, grammar) draws from the whole tempered distribution: an
OpenAI client's default, and vLLM's `vllm bench serve`'s. llama.cpp's chain does that one entry
at a time over its 49k-entry candidate array (copy the row, divide, `expf`, running sum): 0.46 ms
a token here, 4 % of a decode step at one stream and 8 x that per step at eight, where
llama-server's default chain (top_k 40 first) costs a fraction. In NumPy the same arithmetic is
vectorised: divide and `exp` over the row, then the inverse-CDF search in two levels (sums of
256-entry blocks, then within one block) instead of a running sum over all of it: 0.06 ms with
the row in cache, ~0.2 ms right after a decode (docs/performance.md, "The sampler's plain case").

Same distribution as the chain (float32 `exp(logit/T - max)`, one uniform draw), and as
reproducible: a request's seed seeds its own generator, so a seeded request draws the same tokens
on both llama.cpp engines and from a row or from logits the prompt cache kept. The repetition
penalty is llama.cpp's (and vLLM's): a token seen in the window has a positive logit divided by
the penalty, a negative one multiplied.
"""

from __future__ import annotations

import collections

import numpy as np

from raygate.protocol.generation import SamplingParams

_BLOCK = 256


def applies(sampling: SamplingParams) -> bool:
    """Whether the request's chain is only (repetition penalty ->) temperature -> draw."""
    return (
        sampling.temperature > 0
        and sampling.top_p >= 1.0
        and sampling.min_p <= 0
        and sampling.top_k_limit is None
        and not sampling.logit_bias
        and not sampling.presence_penalty
        and not sampling.frequency_penalty
    )


class TemperedDraw:
    """One sequence's draws. Not thread-safe: one decode thread drives it."""

    def __init__(
        self,
        n_vocab: int,
        temperature: float,
        seed: int,
        penalty: float = 1.0,
        prompt: list[int] | None = None,
        window: int = 1,
    ) -> None:
        """`prompt`: the tokens the repetition penalty covers before the first draw; `window`:
        how many of the last tokens it covers (prompt and output), as llama.cpp's sampler."""
        self._n = n_vocab
        self._scale = np.float32(1.0 / temperature)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        padded = -(-n_vocab // _BLOCK) * _BLOCK
        self._buf = np.zeros(padded, dtype=np.float32)  # the tail past n_vocab stays 0
        self._blocks = self._buf.reshape(-1, _BLOCK)
        self._penalty = np.float32(penalty)
        self._recent: collections.deque[int] | None = None  # None: no penalty
        self._counts: collections.Counter[int] = collections.Counter()
        self._seen: np.ndarray | None = None  # the counted ids as an array, rebuilt on change
        if penalty != 1.0:
            window = max(1, window)
            self._recent = collections.deque(maxlen=window)
            for token in (prompt or [])[-window:]:
                self.accept(token)

    def accept(self, token: int) -> None:
        """`token` joins the sequence (drawn here, or forced): the penalty's window moves on."""
        if self._recent is None:
            return
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
                self._seen = None
        self._recent.append(token)
        if token not in self._counts:
            self._seen = None
        self._counts[token] += 1

    def draw(self, logits: np.ndarray) -> int:
        """The next token from `logits` (left as they were), accepted."""
        z = self._buf[: self._n]
        source = logits
        if self._counts:
            if self._seen is None:
                self._seen = np.fromiter(self._counts, dtype=np.int64, count=len(self._counts))
            z[:] = logits
            seen = z[self._seen]
            z[self._seen] = np.where(seen > 0, seen / self._penalty, seen * self._penalty)
            source = z
        # The row is read and written as few times as it can be: its 196 KB have left the cache
        # by the time the decode returns.
        top = source.max()
        if not np.isfinite(top):
            raise RuntimeError("the sampler chain selected no token")
        np.subtract(source, top, out=z)
        if self._scale != 1:
            z *= self._scale
        np.exp(z, out=z)
        sums = np.cumsum(self._blocks.sum(axis=1), dtype=np.float64)
        target = self._rng.random() * sums[-1]
        block = min(int(np.searchsorted(sums, target, side="right")), len(sums) - 1)
        before = sums[block - 1] if block else 0.0
        inner = np.cumsum(self._blocks[block], dtype=np.float64)
        inner += before
        token = block * _BLOCK + min(int(np.searchsorted(inner, target, side="right")), _BLOCK - 1)
        if token >= self._n or z[token] == 0:  # rounding at a block's end: its last likely token
            likely = np.flatnonzero(z[: min(token + 1, self._n)])
            token = int(likely[-1]) if len(likely) else int(np.argmax(z))
        self.accept(token)
        return token
