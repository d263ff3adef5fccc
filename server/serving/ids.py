"""Ids the gateway mints for the objects it returns (`chatcmpl-…`, `cmpl-…`, `embd-…`)."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    """OpenAI's shape, `<prefix>-<random>`: unique per response, and the engine request ids of the
    response's sequences are derived from it (`<id>-<choice>`)."""
    return f"{prefix}-{uuid.uuid4().hex}"
