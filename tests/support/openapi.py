"""Validate our JSON against OpenAI's published OpenAPI document (tests/data, unmodified copy).

The document mixes OpenAPI 3.0's `nullable: true` into 3.1 schemas; JSON Schema ignores that
keyword, so it is rewritten to a `null` alternative before validating.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SPEC = Path(__file__).resolve().parent.parent / "data" / "openai-openapi.yaml"


def _denullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_denullable(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _denullable(v) for k, v in node.items()}
    if out.pop("nullable", False):
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        elif "type" not in out:
            return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _document() -> dict[str, Any]:
    with SPEC.open() as f:
        raw = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {"components": _denullable(raw["components"])}


@cache
def _validator(component: str) -> jsonschema.Draft202012Validator:
    root = {**_document(), "$ref": f"#/components/schemas/{component}"}
    return jsonschema.Draft202012Validator(root)


def validate(instance: Any, component: str) -> None:
    """Raise `jsonschema.ValidationError` if `instance` is not a valid `component`."""
    errors = sorted(_validator(component).iter_errors(instance), key=lambda e: list(e.path))
    if errors:
        raise errors[0]
