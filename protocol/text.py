"""Text that cannot be encoded: lone UTF-16 surrogates.

JSON may spell any UTF-16 code unit (`"\\ud800"`), and Python's `json` turns an unpaired one into a
`str` holding a lone surrogate. Such a string has no UTF-8 form: the first `.encode()` on its way to
a tokenizer, a file name or a log line raises. Request and configuration bases (protocol/base.py)
refuse it at validation, naming the field, so every endpoint answers 400 on every engine instead of
failing inside one.

Text that splits a line: JSON leaves U+2028, U+2029 and U+0085 raw inside strings (pydantic does,
and `json.dumps(ensure_ascii=False)`), and Python's `str.splitlines()` ends a line at each, with it
httpx's `iter_lines()`, which the ollama client and many SSE readers use. `one_line` escapes them
in JSON text sent one object per line (SSE frames, NDJSON, batch output files).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

_SURROGATE = re.compile("[\ud800-\udfff]")
# Guards the walk of free-form values (`dict[str, Any]`): deeper JSON is refused elsewhere.
_MAX_WALK_DEPTH = 256


_UNICODE_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def one_line(json_text: str) -> str:
    """JSON text no line reader splits: only JSON strings can hold these characters, where the
    escape means the same. Costs nothing for ASCII text (`isascii` is a flag in CPython)."""
    return json_text if json_text.isascii() else json_text.translate(_UNICODE_LINE_BREAKS)


def printable(text: str) -> str:
    """`text` with lone surrogates written as `\\udXXX` escapes: safe in a message or a log line
    (an error message holding one cannot even be built by pydantic)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _where(path: list[str | int]) -> str:
    return printable("".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip("."))


def _strings(value: Any, path: list[str | int], depth: int = 0) -> Iterator[tuple[str, list[str | int]]]:
    """Every string in a validated field value, with its path below the field. Nested models are
    skipped: they check their own fields."""
    if isinstance(value, str):
        yield value, path
    elif isinstance(value, BaseModel) or depth > _MAX_WALK_DEPTH:
        return
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                yield k, [*path, k]
            yield from _strings(v, [*path, k if isinstance(k, (str, int)) else str(k)], depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, [*path, i], depth + 1)


def invalid_text(value: Any) -> str | None:
    """A description of the first lone surrogate in `value` (a string, or strings nested in lists
    and dicts), or None when all of its text is valid Unicode."""
    for text, path in _strings(value, []):
        if text.isascii():
            continue
        found = _SURROGATE.search(text)
        if found is not None:
            where = f" in `{_where(path)}`" if path else ""
            return (
                f"invalid Unicode{where}: a lone surrogate (U+{ord(found.group()):04X}) at character "
                f"{found.start()}; text must be valid UTF-8"
            )
    return None


def check_text(value: Any) -> Any:
    """A pydantic `after` validator: the value unchanged, or ValueError naming the bad character."""
    problem = invalid_text(value)
    if problem is not None:
        raise ValueError(problem)
    return value
