"""Integer bounds in JSON schemas become exact GBNF ranges (llama-cpp-python's converter ignores
them): checked by turning the rule into a regular expression and testing every number nearby."""

from __future__ import annotations

import re

import pytest

from raygate.backends.engines.llama_cpp.int_range import bounds, range_rule


def _regex(rule: str) -> re.Pattern[str]:
    pattern = re.sub(r'"(.)"', lambda m: re.escape(m.group(1)), rule).replace(" ", "")
    return re.compile(pattern)


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0, 150), (1, 9), (0, 0), (7, 7), (5, 1234), (-40, 40), (-150, -3), (99, 100), (10, 99), (-1, 0)],
)
def test_the_rule_matches_exactly_the_range(lo: int, hi: int) -> None:
    regex = _regex(range_rule(lo, hi))
    for n in range(lo - 300, hi + 300):
        assert bool(regex.fullmatch(str(n))) == (lo <= n <= hi), n
    for written in ("007", "-0", "00", "+5", "01"):
        assert not regex.fullmatch(written)


def test_bounds_read_every_keyword() -> None:
    assert bounds({"type": "integer", "minimum": 0, "maximum": 150}) == (0, 150)
    assert bounds({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}) == (1, 9)
    assert bounds({"type": "integer", "minimum": 0.5, "maximum": 9.5}) == (1, 9)
    lo, hi = bounds({"type": "integer", "minimum": 3})
    assert lo == 3 and hi == 10**16 - 1
    with pytest.raises(ValueError, match="no integer"):
        bounds({"type": "integer", "minimum": 5, "maximum": 4})


def test_a_one_sided_bound_stays_sixteen_digits_long() -> None:
    regex = _regex(range_rule(*bounds({"type": "integer", "maximum": 5})))
    assert regex.fullmatch("-" + "9" * 16) and not regex.fullmatch("-1" + "0" * 16)
    assert regex.fullmatch("5") and not regex.fullmatch("6")
