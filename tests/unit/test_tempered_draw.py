"""The NumPy draw that stands in for llama.cpp's (penalty ->) temperature -> dist chain draws from
the same distribution, penalises as llama.cpp's penalty sampler does, and is reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from raygate.backends.engines.llama_cpp import tempered_draw
from raygate.backends.engines.llama_cpp.tempered_draw import TemperedDraw
from raygate.protocol.generation import SamplingParams

DRAWS = 40_000


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def frequencies(draw: TemperedDraw, logits: np.ndarray) -> np.ndarray:
    counts = np.bincount([draw.draw(logits) for _ in range(DRAWS)], minlength=len(logits))
    return counts / DRAWS


@pytest.mark.parametrize(("n_vocab", "temperature"), [(1000, 1.0), (600, 0.7), (256, 2.0)])
def test_draws_follow_the_tempered_softmax(n_vocab: int, temperature: float) -> None:
    """Vocabularies that do and do not fill the last 256-token block. The tokens, likeliest
    first, in 20 groups of about equal probability: each group's share is within 5 standard
    errors of 40k draws (~0.006) of the exact one; so are the five likeliest tokens'."""
    logits = np.random.default_rng(n_vocab).normal(0, 2, n_vocab).astype(np.float32)
    expected = softmax(logits / temperature)
    got = frequencies(TemperedDraw(n_vocab, temperature, seed=1), logits)
    order = np.argsort(expected)[::-1]
    groups = np.minimum((np.cumsum(expected[order]) * 20).astype(int), 19)
    assert np.allclose(np.bincount(groups, got[order]), np.bincount(groups, expected[order]), atol=0.006)
    assert np.allclose(got[order[:5]], expected[order[:5]], atol=0.006)


def test_banned_tokens_are_never_drawn_and_the_logits_are_left_as_they_were() -> None:
    logits = np.zeros(700, dtype=np.float32)
    logits[[3, 500, 699]] = -np.inf
    before = logits.copy()
    got = frequencies(TemperedDraw(700, 1.0, seed=2), logits)
    assert got[[3, 500, 699]].sum() == 0
    assert np.array_equal(logits, before)


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    """First draws over many seeds (each draw then joins the window): the prompt's tokens 0 and 2
    are penalised, 1, 3 and 4 are not."""
    logits = np.array([2.0, 2.0, -1.0, -1.0, 0.5], dtype=np.float32)
    penalised = np.array([1.0, 2.0, -2.0, -1.0, 0.5], dtype=np.float32)
    firsts = [
        TemperedDraw(5, 1.0, seed=s, penalty=2.0, prompt=[0, 2], window=64).draw(logits) for s in range(DRAWS)
    ]
    assert np.allclose(np.bincount(firsts, minlength=5) / DRAWS, softmax(penalised), atol=0.01)


def test_the_penalty_window_forgets_what_slid_out_of_it() -> None:
    """A one-token window and a crushing penalty: each draw bans itself for the next one only."""
    draw = TemperedDraw(2, 1.0, seed=4, penalty=1e6, prompt=[1], window=1)
    assert [draw.draw(np.array([20.0, 20.0], dtype=np.float32)) for _ in range(4)] == [0, 1, 0, 1]


def test_a_seed_reproduces_its_draws() -> None:
    logits = np.random.default_rng(5).normal(0, 1, 3000).astype(np.float32)
    one = TemperedDraw(3000, 0.9, seed=7)
    two = TemperedDraw(3000, 0.9, seed=7)
    drawn = [one.draw(logits) for _ in range(50)]
    assert drawn == [two.draw(logits) for _ in range(50)]
    assert len(set(drawn)) > 10  # a draw, not a fixed choice


def test_a_row_with_no_possible_token_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="selected no token"):
        TemperedDraw(300, 1.0, seed=6).draw(np.full(300, -np.inf, dtype=np.float32))


@pytest.mark.parametrize(
    ("params", "applies"),
    [
        ({"temperature": 1.0}, True),
        ({"temperature": 0.8, "repetition_penalty": 1.1}, True),
        ({"temperature": 0.0}, False),
        ({"temperature": 1.0, "top_p": 0.9}, False),
        ({"temperature": 1.0, "min_p": 0.05}, False),
        ({"temperature": 1.0, "top_k": 40}, False),
        ({"temperature": 1.0, "logit_bias": {1: 5.0}}, False),
        ({"temperature": 1.0, "presence_penalty": 0.5}, False),
        ({"temperature": 1.0, "frequency_penalty": 0.5}, False),
    ],
)
def test_it_stands_in_only_for_a_chain_of_penalty_temperature_and_draw(
    params: dict[str, object], applies: bool
) -> None:
    assert tempered_draw.applies(SamplingParams(max_tokens=4, **params)) is applies  # type: ignore[arg-type]
