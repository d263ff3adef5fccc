"""The admin key: when `--admin-key` (RAYGATE_ADMIN_KEY) is set, `/admin` wants it as a bearer
token. Separate from client API keys on purpose: whoever may call a model may not redeploy it.
Without a key `/admin` is open; `raygate serve` refuses to listen beyond loopback that way unless
told to (`--allow-open-admin`, server/access/exposure.py). `--closed-admin` (the container image's
default) refuses `/admin` with a 403 until a key is set, so the gateway can listen everywhere and
still serve `/v1`.

The header is parsed exactly as on `/v1` (server/access/auth.py `bearer_token`: one header, `Bearer`,
no padding), and compared as SHA-256 digests in constant time. Xinference's registry-changing
routes under `/v1` (`is_admin_path`) want the same key.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from raygate.protocol.errors import AuthenticationError, PermissionDeniedError
from raygate.server.access.auth import bearer_token

# Xinference's API (server/routes/xinference.py) changes the registry under /v1: these requests want
# the admin key, not a client's API key (the middleware leaves them to `require_admin_key`).
XINFERENCE_REGISTRATIONS = "/v1/model_registrations"
# vLLM's run-time LoRA endpoints (server/routes/lora.py) change the registry too.
LORA_ADMIN_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


# Ollama's `DELETE /api/delete` undeploys a model and `POST /api/pull` deploys one
# (server/routes/ollama.py): the admin key's too.
OLLAMA_ADMIN_PATHS = ("/api/delete", "/api/pull")


def is_admin_path(method: str, path: str) -> bool:
    """Registrations (any method), launch (`POST /v1/models`), terminate (`DELETE /v1/models/{uid}`)
    and Ollama's delete and pull, and vLLM's LoRA load/unload."""
    if path == XINFERENCE_REGISTRATIONS or path.startswith(XINFERENCE_REGISTRATIONS + "/"):
        return True
    if path in OLLAMA_ADMIN_PATHS or path in LORA_ADMIN_PATHS:
        return True
    return (method == "POST" and path == "/v1/models") or (
        method == "DELETE" and path.startswith("/v1/models/")
    )


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


async def require_admin_key(request: Request) -> None:
    settings = request.app.state.settings
    expected: str | None = settings.admin_key
    if not expected:
        if settings.closed_admin:
            raise PermissionDeniedError(
                "/admin is closed: no admin key is configured. Set RAYGATE_ADMIN_KEY or "
                "RAYGATE_ADMIN_KEY_FILE (a Docker secret) and restart the gateway.",
                code="admin_closed",
            )
        return
    token = bearer_token(request.headers.getlist("authorization"), what="admin key")
    if not hmac.compare_digest(_digest(token), _digest(expected)):
        raise AuthenticationError(
            "Incorrect admin key: send it as `Authorization: Bearer <admin key>` "
            "(raygate CLI: --admin-key or RAYGATE_ADMIN_KEY)."
        )
