"""What a constrained answer may look like whatever the CPU's numbers: the checks and budgets the
tests on generated JSON and tool calls use instead of one machine's greedy text.

A tiny model's greedy output moves with the CPU (bf16 and quantised kernels round differently):
where it stops is no promise. What the features promise is structure: a `json_object` answer is
a JSON object, or (cut off by `max_tokens`) the beginning of one; a `json_schema` answer or a
tool call validates; and an answer bounded by its schema (every string with `maxLength`, every
array with `maxItems`, every value an enum ...) ends within the longest text the schema allows.
`max_json_bytes` is that length, in bytes: a token is at least one byte, so as `max_tokens` it
guarantees `finish_reason: stop` (or `tool_calls`) on any machine.
"""

from __future__ import annotations

import json
from typing import Any

from raygate.backends.engines import tool_calls
from raygate.protocol.generation import FunctionTool

# Both engines allow at most one space between JSON tokens (llama-cpp-python's SPACE_RULE,
# vLLM's max_whitespace_cnt) and at most 16 digits per integer
# (backends/engines/vllm/sampling_params.py).
SPACE = 1
INTEGER = len("-") + 16
# A string character may be written as a \uXXXX escape.
CHAR = 6


def max_json_bytes(schema: dict[str, Any]) -> int:
    """The longest JSON text (in bytes, trailing space included) that a grammar made from
    `schema` lets an engine write. Raises for a schema with no such bound."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"]) + SPACE
    if "const" in schema:
        return len(json.dumps(schema["const"])) + SPACE
    if "anyOf" in schema:
        return max(max_json_bytes(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "string":
        if "maxLength" not in schema:
            raise ValueError(f"an unbounded string has no longest text: {schema}")
        return 2 + CHAR * schema["maxLength"] + SPACE
    if kind == "integer":
        return INTEGER + SPACE
    if kind == "boolean":
        return len("false") + SPACE
    if kind == "null":
        return len("null") + SPACE
    if kind == "array":
        if "maxItems" not in schema:
            raise ValueError(f"an unbounded array has no longest text: {schema}")
        item = max_json_bytes(schema["items"]) + len(",") + SPACE
        return len("[]") + 2 * SPACE + schema["maxItems"] * item
    if kind == "object":
        if schema.get("additionalProperties") not in (None, False):
            raise ValueError(f"an object open to any property has no longest text: {schema}")
        size = len("{}") + 2 * SPACE
        for key, sub in schema.get("properties", {}).items():
            size += len(json.dumps(key)) + SPACE + len(":") + SPACE + max_json_bytes(sub) + len(",") + SPACE
        return size
    raise ValueError(f"no longest text known for {schema}")


def max_call_bytes(tools: list[Any], calls: int = 1) -> int:
    """The longest text of `calls` tool-call blocks (tools/call_schema.py's format), tools given
    as OpenAI's `{"type": "function", "function": {...}}` dicts."""
    functions = [
        FunctionTool(t["function"]["name"], t["function"].get("description"), t["function"].get("parameters"))
        for t in tools
    ]
    block = (
        len(tool_calls.OPEN + "\n")
        + max_json_bytes(tool_calls.call_schema(functions))
        + len("\n" + tool_calls.CLOSE)
    )
    return calls * (block + len("\n"))


class _IncompleteError(Exception):
    """The text ended where more JSON was due."""


class _InvalidError(Exception):
    """The text cannot be the beginning of a JSON value."""


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\n\r":
        i += 1
    return i


def _need(s: str, i: int) -> str:
    if i >= len(s):
        raise _IncompleteError
    return s[i]


def _string(s: str, i: int) -> int:
    i += 1  # the opening quote
    while True:
        c = _need(s, i)
        if c == '"':
            return i + 1
        if c == "\\":
            e = _need(s, i + 1)
            if e == "u":
                for k in range(4):
                    if _need(s, i + 2 + k) not in "0123456789abcdefABCDEF":
                        raise _InvalidError(i)
                i += 6
                continue
            if e not in '"\\/bfnrt':
                raise _InvalidError(i)
            i += 2
            continue
        if ord(c) < 0x20:
            raise _InvalidError(i)
        i += 1


def _digits(s: str, i: int) -> int:
    start = i
    while i < len(s) and s[i].isdigit():
        i += 1
    if i == start:
        _need(s, i)
        raise _InvalidError(i)
    return i


def _number(s: str, i: int) -> int:
    if s[i] == "-":
        i += 1
    if _need(s, i) == "0":
        i += 1
    else:
        i = _digits(s, i)
    if i < len(s) and s[i] == ".":
        i = _digits(s, i + 1)
    if i < len(s) and s[i] in "eE":
        i += 1
        if _need(s, i) in "+-":
            i += 1
        i = _digits(s, i)
    return i


def _value(s: str, i: int) -> int:
    i = _ws(s, i)
    c = _need(s, i)
    if c == "{":
        i = _ws(s, i + 1)
        if _need(s, i) == "}":
            return i + 1
        while True:
            if _need(s, i) != '"':
                raise _InvalidError(i)
            i = _ws(s, _string(s, i))
            if _need(s, i) != ":":
                raise _InvalidError(i)
            i = _ws(s, _value(s, i + 1))
            c = _need(s, i)
            if c == "}":
                return i + 1
            if c != ",":
                raise _InvalidError(i)
            i = _ws(s, i + 1)
    if c == "[":
        i = _ws(s, i + 1)
        if _need(s, i) == "]":
            return i + 1
        while True:
            i = _ws(s, _value(s, i))
            c = _need(s, i)
            if c == "]":
                return i + 1
            if c != ",":
                raise _InvalidError(i)
            i += 1
    if c == '"':
        return _string(s, i)
    if c == "-" or c.isdigit():
        return _number(s, i)
    for word in ("true", "false", "null"):
        if s.startswith(word, i):
            return i + len(word)
        if word.startswith(s[i:]):
            raise _IncompleteError
    raise _InvalidError(i)


def is_json_prefix(text: str) -> bool:
    """Whether `text` is a JSON value or the beginning of one (what a grammar-constrained answer
    cut off by `max_tokens` is)."""
    try:
        end = _value(text, 0)
    except _IncompleteError:
        return True
    except _InvalidError:
        return False
    return _ws(text, end) == len(text)


def check_json_object(content: str | None, finish_reason: str | None) -> dict[str, Any] | None:
    """A `json_object` answer: a whole JSON object when the model stopped by itself, the
    beginning of one when `max_tokens` cut it off. Returns the object (None when cut off)."""
    text = content or ""
    assert finish_reason in ("stop", "length"), finish_reason
    if finish_reason == "stop":
        value = json.loads(text)
        assert isinstance(value, dict), text
        return value
    assert text.lstrip().startswith("{") or not text.strip(), text
    assert is_json_prefix(text), text
    return None


def penalty_must_change(
    tokens: list[str], tops: list[dict[str, float]], presence: float = 0.0, frequency: float = 0.0
) -> bool:
    """Whether OpenAI's presence/frequency penalties must change this greedy text, by this
    machine's own numbers: at some step the token chosen, already written, falls below another
    of that step's listed candidates once each is penalised for its earlier occurrences (both
    engines penalise generated tokens only). Until that step the penalised run writes the same
    text, so its logits there are these; if an earlier step changes instead, the text differs
    anyway. `tops`: each step's top logprobs (raw, as both engines report them)."""
    for t, (chosen, top) in enumerate(zip(tokens, tops, strict=True)):
        earlier = tokens[:t]
        penalised = {
            token: logprob - frequency * earlier.count(token) - presence * (token in earlier)
            for token, logprob in top.items()
        }
        if chosen in top and max(penalised, key=penalised.__getitem__) != chosen:
            return True
    return False


# A schema whose every string and array is bounded, shared by the structured-output suite
# (tests/support/suites/structured_output.py) and the batched-API test.
# Only what both engines' grammars enforce: llama-cpp-python's converter ignores an integer's
# minimum/maximum (it bounds integers to 16 digits), so a bound there would be a promise the
# llama.cpp backend does not keep.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "mood": {"type": "string", "enum": ["happy", "sad"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "mood", "tags"],
    "additionalProperties": False,
}
PERSON_MAX_TOKENS = max_json_bytes(PERSON)  # the answer must end by itself within this
