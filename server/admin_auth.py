"""The admin key: when `--admin-key` (RAYGATE_ADMIN_KEY) is set, `/admin` wants it as a bearer
token. Separate from client API keys on purpose: whoever may call a model may not redeploy it.
Without a key `/admin` is open, like the rest of a gateway that listens on 127.0.0.1 by default.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from protocol.errors import AuthenticationError


async def require_admin_key(request: Request) -> None:
    expected: str | None = request.app.state.settings.admin_key
    if not expected:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise AuthenticationError(
            "Missing or incorrect admin key: send it as `Authorization: Bearer <admin key>` "
            "(raygate CLI: --admin-key or RAYGATE_ADMIN_KEY)."
        )
