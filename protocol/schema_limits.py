"""Bounds on what a JSON schema may ask of a grammar, checked before any engine sees it.

`response_format.json_schema.schema` and each tool's `parameters` become a grammar in the replica
(llama.cpp's GBNF via llama-cpp-python's converter; xgrammar on vLLM). Some schemas cost far more
there than their size suggests, so they are refused here, for both engines alike, with a 400 that
names the keyword and the limit. Measured with llama-cpp-python 0.3.36 (SmolLM2's vocabulary,
converter + `llama_sampler_init_grammar` in a worker thread, 8 MiB stack):

* `maxLength` / `maxItems` N become N nested optional groups. llama.cpp compiles up to ~1,010 and
  refuses more ("exceeds sane defaults"), and its parser overflows the stack and kills the process
  from ~19,000 (`maxLength: 30000` segfaulted every replica it was retried on).
* `minLength` / `minItems` N become a flat sequence of N items: 10^5 is a 500 KB grammar;
  10^9 grows the replica's memory until it dies.
* Repetition multiplies across alternatives: 200 `anyOf` branches with `maxLength: 1000` made a
  1.6 MB grammar (1.3 s to compile, +100 MB); 10 branches: 80 KB, 43 ms.
* Optional properties cost quadratically in the converter: 256 in one object took 0.21 s; 1,000
  overflow Python's recursion limit. An `enum` of 10,000 values does too; 2,000 compile in 17 ms.

Hence: every repetition keyword and `{n,m}` quantifier at most `MAX_REPEAT` (1,000, llama.cpp's
own ceiling, ~19x under the crash), their sum over all the schemas of a request at most
`MAX_REPEAT_TOTAL`, and bounds on nesting, properties, enum values, pattern size and total size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from raygate.protocol.text import printable

MAX_REPEAT = 1000  # minLength, maxLength, minItems, maxItems, minProperties, maxProperties, {n,m}
MAX_REPEAT_TOTAL = 10_000  # their sum over every schema of one request
MAX_DEPTH = 64  # nested JSON containers (objects and arrays) in one schema document
MAX_PROPERTIES = 256  # properties of one object
MAX_PROPERTIES_TOTAL = 1000  # properties of all objects of one request's schemas
MAX_ENUM = 1000  # values of one `enum`
MAX_PATTERN_CHARS = 1000  # length of one `pattern`
MAX_PATTERN_GROUPS = 32  # nested parentheses in one `pattern`
MAX_SCHEMA_BYTES = 64 * 1024  # one schema, as compact JSON
MAX_SCHEMA_BYTES_TOTAL = 256 * 1024  # every schema of one request

_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
# Keywords whose values are data (JSON values the output may take), not schemas: never walked.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


class SchemaLimitError(ValueError):
    """A schema over one of the bounds above; the message names the keyword, where, and the limit."""


@dataclass(slots=True)
class SchemaCost:
    """What one schema (or several, summed) asks of a grammar compiler."""

    repeat: int = 0
    properties: int = 0
    size: int = 0

    def __add__(self, other: SchemaCost) -> SchemaCost:
        return SchemaCost(
            self.repeat + other.repeat, self.properties + other.properties, self.size + other.size
        )


def _pointer(path: list[str | int]) -> str:
    """A JSON pointer (RFC 6901) to a subschema, printable whatever the property names hold."""
    return printable("/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path))


def _refuse(keyword: str, path: list[str | int], detail: str) -> SchemaLimitError:
    return SchemaLimitError(f"`{keyword}` at `{_pointer(path)}` {detail}")


def _count(node: dict[str, Any], keyword: str, path: list[str | int]) -> int | None:
    value = node.get(keyword)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, (dict, list)):
            return None  # e.g. a property that happens to be named `maxLength`: not a keyword here
        raise _refuse(keyword, path, "must be a non-negative integer")
    if isinstance(value, float) and not value.is_integer():
        raise _refuse(keyword, path, "must be a non-negative integer")
    if value < 0:
        raise _refuse(keyword, path, "must be a non-negative integer")
    if value > MAX_REPEAT:
        raise _refuse(keyword, path, f"is {value:g}; the limit is {MAX_REPEAT}")
    return int(value)


def _pattern_repeat(pattern: str, path: list[str | int]) -> int:
    """The sum of the `{n}` / `{n,m}` counts in a regular expression (each at most MAX_REPEAT),
    after checking its length and group nesting."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _refuse("pattern", path, f"is {len(pattern)} characters long; the limit is {MAX_PATTERN_CHARS}")
    total, depth, i, n = 0, 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a character class: its `{`, `(` are literals
            i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "(":
            depth += 1
            if depth > MAX_PATTERN_GROUPS:
                raise _refuse("pattern", path, f"nests groups deeper than the limit of {MAX_PATTERN_GROUPS}")
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == "{":
            end = pattern.find("}", i)
            if end < 0:
                break
            counts = [s.strip() for s in pattern[i + 1 : end].split(",")]
            for s in counts:
                if s.isdigit() and int(s) > MAX_REPEAT:
                    raise _refuse(
                        "pattern",
                        path,
                        f"repeats {{{pattern[i + 1 : end]}}} times; the limit is {MAX_REPEAT}",
                    )
            total += max((int(s) for s in counts if s.isdigit()), default=0)
            i = end
        i += 1
    return total


def _walk(node: Any, path: list[str | int], depth: int, cost: SchemaCost) -> None:
    if depth > MAX_DEPTH:
        raise _refuse("schema", path, f"nests deeper than the limit of {MAX_DEPTH} levels")
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, [*path, i], depth + 1, cost)
        return
    if not isinstance(node, dict):
        return
    for low_key, high_key in _PAIRS:
        low, high = _count(node, low_key, path), _count(node, high_key, path)
        if low is not None and high is not None and low > high:
            raise _refuse(low_key, path, f"is {low}, above `{high_key}` ({high}): no value can satisfy it")
        cost.repeat += max(low or 0, high or 0)
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        cost.repeat += _pattern_repeat(pattern, path)
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > MAX_ENUM:
        raise _refuse("enum", path, f"lists {len(enum)} values; the limit is {MAX_ENUM}")
    properties = node.get("properties")
    if isinstance(properties, dict):
        if len(properties) > MAX_PROPERTIES:
            raise _refuse(
                "properties",
                path,
                f"has {len(properties)} properties; the limit is {MAX_PROPERTIES} per object",
            )
        cost.properties += len(properties)
    for key, value in node.items():
        if key in _DATA_KEYWORDS or not isinstance(value, (dict, list)):
            continue
        if key == "properties" and isinstance(value, dict):
            # A map of names to schemas: walk the schemas, and treat no name as a keyword.
            for name, sub in value.items():
                _walk(sub, [*path, key, name], depth + 2, cost)
        else:
            _walk(value, [*path, key], depth + 1, cost)


def schema_cost(schema: Any) -> SchemaCost:
    """Check one schema against the per-schema bounds; raise SchemaLimitError naming the first
    keyword over its limit, else return what it costs (for the per-request totals)."""
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False, default=str))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaLimitError(f"the schema is {size} bytes as JSON; the limit is {MAX_SCHEMA_BYTES}")
    cost = SchemaCost(size=size)
    _walk(schema, [], 0, cost)
    return cost


def check_total(cost: SchemaCost) -> None:
    """The per-request bounds, over the summed cost of every schema of one request."""
    if cost.repeat > MAX_REPEAT_TOTAL:
        raise SchemaLimitError(
            f"the schemas repeat {cost.repeat} items in all (minLength, maxLength, minItems, "
            f"maxItems, pattern counts); the limit is {MAX_REPEAT_TOTAL} per request"
        )
    if cost.properties > MAX_PROPERTIES_TOTAL:
        raise SchemaLimitError(
            f"the schemas have {cost.properties} properties in all; "
            f"the limit is {MAX_PROPERTIES_TOTAL} per request"
        )
    if cost.size > MAX_SCHEMA_BYTES_TOTAL:
        raise SchemaLimitError(
            f"the schemas are {cost.size} bytes of JSON in all; "
            f"the limit is {MAX_SCHEMA_BYTES_TOTAL} per request"
        )


def check_schema(schema: Any) -> Any:
    """A pydantic `after` validator for one schema field: the schema, or ValueError."""
    if schema is not None:
        check_total(schema_cost(schema))
    return schema
