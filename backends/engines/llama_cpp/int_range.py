"""GBNF for a JSON-schema integer with bounds (`minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum`).

llama-cpp-python's schema converter leaves integer bounds as a TODO, so `{"type": "integer",
"minimum": 0, "maximum": 150}` decoded as any integer and a `json_schema` answer could fail its own
schema. Here a range becomes alternatives of digit classes, one per number of digits and per
differing leading digit (the classic range-to-regex split), so the grammar admits exactly the
integers in range, written as JSON writes them (no leading zeros, `-0` never).

A side without a bound stops at 16 digits, the limit the unbounded integers of both engines'
grammars already have.
"""

from __future__ import annotations

import math
from typing import Any

UNBOUNDED = 10**16 - 1
BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def has_bounds(schema: dict[str, Any]) -> bool:
    """Whether an integer schema asks for a range the converter would ignore."""
    return any(
        isinstance(schema.get(k), int | float) and not isinstance(schema.get(k), bool) for k in BOUND_KEYS
    )


def bounds(schema: dict[str, Any]) -> tuple[int, int]:
    """The inclusive integer range a schema allows; ValueError when it is empty."""
    lo, hi = -UNBOUNDED, UNBOUNDED
    if isinstance(schema.get("minimum"), int | float):
        lo = max(lo, math.ceil(schema["minimum"]))
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        lo = max(lo, math.floor(schema["exclusiveMinimum"]) + 1)
    if isinstance(schema.get("maximum"), int | float):
        hi = min(hi, math.floor(schema["maximum"]))
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        hi = min(hi, math.ceil(schema["exclusiveMaximum"]) - 1)
    if lo > hi:
        raise ValueError(f"no integer satisfies the bounds of {schema}")
    return lo, hi


def range_rule(lo: int, hi: int) -> str:
    """A GBNF expression matching exactly the decimal integers in `[lo, hi]`."""
    alternatives: list[str] = []
    if lo < 0:
        negative = _non_negative(max(1, -hi), -lo)
        alternatives.append('"-" (' + " | ".join(negative) + ")")
    if hi >= 0:
        alternatives += _non_negative(max(lo, 0), hi)
    return "(" + " | ".join(alternatives) + ")"


def _non_negative(lo: int, hi: int) -> list[str]:
    out: list[str] = []
    for digits in range(len(str(lo)), len(str(hi)) + 1):
        start = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        end = min(hi, 10**digits - 1)
        if start <= end:
            out += _same_length(str(start), str(end))
    return out


def _same_length(low: str, high: str) -> list[str]:
    """Sequences matching the numbers from `low` to `high`, both of the same length."""
    n = len(low)
    if low == "0" * n and high == "9" * n:
        return [" ".join(["[0-9]"] * n)]
    if n == 1:
        return [f"[{low}-{high}]"]
    if low[0] == high[0]:
        return [f'"{low[0]}" {rest}' for rest in _same_length(low[1:], high[1:])]
    out = [f'"{low[0]}" {rest}' for rest in _same_length(low[1:], "9" * (n - 1))]
    first, last = int(low[0]) + 1, int(high[0]) - 1
    if first <= last:
        out.append(" ".join([f"[{first}-{last}]"] + ["[0-9]"] * (n - 1)))
    out += [f'"{high[0]}" {rest}' for rest in _same_length("0" * (n - 1), high[1:])]
    return out
