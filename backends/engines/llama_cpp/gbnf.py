"""GBNF grammars for vLLM's `choice` and `regex` constraints, for llama.cpp's grammar sampler.

llama-cpp-python's JSON-schema converter also turns `pattern` regexes into GBNF, but it refuses
common syntax (`(?:...)`) and writes `\\d{3}` as a literal llama.cpp then cannot parse. So the
regex is parsed here by Python's own regex parser, and each node is written as GBNF; what GBNF
cannot express (look-arounds, back-references, inline flags) is a 400 naming the feature.

As in vLLM, the whole output must match the regex (it is anchored at both ends whether or not it
says so), and `.` does not match a newline.
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from raygate.protocol.errors import BadRequestError

PARAM = "structured_outputs"
# `a{1000000}` is one short regex but a million grammar elements once llama.cpp expands it.
MAX_REPEAT = 1_000

_CATEGORIES = {
    sre.CATEGORY_DIGIT: "0-9",
    sre.CATEGORY_SPACE: " \\t\\n\\r\\x0B\\x0C",
    sre.CATEGORY_WORD: "a-zA-Z0-9_",
}
_NEGATED = {
    sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT,
    sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE,
    sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
}


def _char(code: int, in_class: bool) -> str:
    """One character as GBNF writes it inside a string literal or a character class."""
    ch = chr(code)
    special = '"\\' if not in_class else "]\\^-"
    if 0x20 <= code < 0x7F and ch not in special:
        return ch
    if code <= 0xFF:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def literal(text: str) -> str:
    """A GBNF string literal matching exactly `text`."""
    return '"' + "".join(_char(ord(c), in_class=False) for c in text) + '"'


def choice_grammar(choices: list[str]) -> str:
    """The output is exactly one of `choices`."""
    return "root ::= " + " | ".join(literal(c) for c in choices) + "\n"


def regex_grammar(pattern: str) -> str:
    """The output matches `pattern` as a whole; a 400 for a regex that is invalid or uses
    something GBNF cannot express."""
    try:
        tree = sre_parse.parse(pattern)
    except re.error as exc:
        raise BadRequestError(f"Invalid regex: {exc}", param=PARAM) from None
    if tree.state.flags & (re.IGNORECASE | re.DOTALL | re.MULTILINE):
        raise _unsupported("inline flags")
    items = list(tree)
    # Anchors at the very ends are what the constraint means anyway; anywhere else they are not.
    if items and items[0][0] is sre.AT and items[0][1] in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING):
        items = items[1:]
    if items and items[-1][0] is sre.AT and items[-1][1] in (sre.AT_END, sre.AT_END_STRING):
        items = items[:-1]
    return f"root ::= {_sequence(items)}\n"


def _unsupported(what: str) -> BadRequestError:
    return BadRequestError(f"The regex uses {what}, which a llama.cpp grammar cannot express.", param=PARAM)


def _sequence(items: list[tuple[Any, Any]]) -> str:
    parts: list[str] = []
    run = ""  # consecutive literal characters become one string literal
    for op, av in items:
        if op is sre.LITERAL:
            run += chr(av)
            continue
        if run:
            parts.append(literal(run))
            run = ""
        parts.append(_node(op, av))
    if run:
        parts.append(literal(run))
    return " ".join(parts) if parts else '""'


def _node(op: Any, av: Any) -> str:
    if op is sre.NOT_LITERAL:
        return f"[^{_char(av, in_class=True)}]"
    if op is sre.ANY:
        return "[^\\n]"
    if op is sre.IN:
        return _class(av)
    if op is sre.BRANCH:
        return "(" + " | ".join(_sequence(list(branch)) for branch in av[1]) + ")"
    if op is sre.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        if add_flags or del_flags:
            raise _unsupported("inline flags")
        return f"({_sequence(list(sub))})"
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
        return _repeat(*av)
    names = {
        sre.AT: "anchors inside the pattern",
        sre.GROUPREF: "back-references",
        sre.ASSERT: "look-ahead or look-behind",
        sre.ASSERT_NOT: "look-ahead or look-behind",
    }
    raise _unsupported(names.get(op, f"`{op}`"))


def _repeat(low: int, high: int, sub: Any) -> str:
    unbounded = high is sre.MAXREPEAT
    if low > MAX_REPEAT or (not unbounded and high > MAX_REPEAT):
        raise BadRequestError(f"Regex repetition counts are limited to {MAX_REPEAT}.", param=PARAM)
    body = f"({_sequence(list(sub))})"
    if (low, unbounded) == (0, True):
        return body + "*"
    if (low, unbounded) == (1, True):
        return body + "+"
    if (low, high) == (0, 1):
        return body + "?"
    return body + (f"{{{low},}}" if unbounded else f"{{{low},{high}}}")


def _class(items: list[tuple[Any, Any]]) -> str:
    negate = bool(items) and items[0][0] is sre.NEGATE
    items = items[1:] if negate else items
    if len(items) == 1 and items[0][0] is sre.CATEGORY and items[0][1] in _NEGATED:
        if negate:  # [^\D] is \d
            return f"[{_CATEGORIES[_NEGATED[items[0][1]]]}]"
        return f"[^{_CATEGORIES[_NEGATED[items[0][1]]]}]"
    body = ""
    for op, av in items:
        if op is sre.LITERAL:
            body += _char(av, in_class=True)
        elif op is sre.RANGE:
            body += f"{_char(av[0], in_class=True)}-{_char(av[1], in_class=True)}"
        elif op is sre.CATEGORY and av in _CATEGORIES:
            body += _CATEGORIES[av]
        else:
            raise _unsupported("a negated class (\\D, \\S, \\W) inside brackets")
    return f"[{'^' if negate else ''}{body}]"
