"""Signatures on Anthropic `thinking` blocks: an HMAC of the thinking text under the gateway's key.

Anthropic signs each thinking block so that a block an agent sends back (it must, in a tool-use
loop) is known to be the model's own, unedited. Raygate does the same with HMAC-SHA256 under
`--thinking-signing-key` (a random key per process when unset: blocks then verify only on the
gateway that made them), and answers a block whose signature does not match with a 400, as
Anthropic does. The thinking is still not shown to the model again (Anthropic drops it too).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from fastapi import Request

from raygate.protocol.errors import BadRequestError
from raygate.protocol.messages import MessagesInput

_PROCESS_KEY = secrets.token_bytes(32)


def _key(request: Request) -> bytes:
    configured = request.app.state.settings.thinking_signing_key
    return configured.encode() if configured else _PROCESS_KEY


def sign(request: Request, thinking: str) -> str:
    digest = hmac.new(_key(request), thinking.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def check_returned(request: Request, body: MessagesInput) -> None:
    """Every `thinking` block sent back must carry the signature this gateway gave it."""
    for where, block in body.thinking_blocks():
        expected = sign(request, block.thinking or "")
        # As bytes: `compare_digest` refuses a str with non-ASCII characters (the fuzz sent one).
        given = None if block.signature is None else block.signature.encode("utf-8", "surrogatepass")
        if given is None or not hmac.compare_digest(given, expected.encode()):
            raise BadRequestError(
                "Invalid `signature` in a `thinking` block: send thinking blocks back unchanged.",
                param=f"{where}.signature",
            )
