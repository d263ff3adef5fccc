"""Who can reach the gateway, checked before it starts.

Without `--admin-key`, `/admin` lets anyone who can connect deploy, replace and remove models. That
is fine on loopback (the default `--host 127.0.0.1`), and a trap anywhere else: listening beyond
loopback with an open `/admin` needs an explicit `--allow-open-admin` (RAYGATE_ALLOW_OPEN_ADMIN=1)
or `--closed-admin` (`/admin` refused until a key is set: the container image's default),
otherwise `raygate serve` exits with a message saying what to do. Without API keys `/v1` is open
to everyone who can connect: allowed, with a warning.

No message here ever holds a key: only which setting is wrong.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from raygate.server.access.auth import MIN_KEY_CHARS
from raygate.server.settings import ConfigError, Settings

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """True when every address `host` stands for is a loopback address (127.0.0.0/8, ::1).
    `0.0.0.0`, `::` and an empty host mean every interface: not loopback."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:  # a host name: loopback only if all it resolves to is
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_exposure(settings: Settings, api_keys_configured: bool) -> list[str]:
    """Raise ConfigError for a start that would expose `/admin` without a key (unless allowed);
    return the warnings to log for what is open but allowed."""
    if settings.admin_key is not None and len(settings.admin_key) < MIN_KEY_CHARS:
        raise ConfigError(
            f"the admin key (--admin-key / RAYGATE_ADMIN_KEY) is too short: it needs at least "
            f"{MIN_KEY_CHARS} characters"
        )
    if is_loopback(settings.host):
        return []
    warnings = []
    if not settings.admin_key and settings.closed_admin:
        warnings.append(
            "/admin is closed (403): no admin key is set (RAYGATE_ADMIN_KEY or RAYGATE_ADMIN_KEY_FILE)"
        )
    elif not settings.admin_key:
        if not settings.allow_open_admin:
            raise ConfigError(
                f"refusing to listen on {settings.host} with /admin open to anyone who can connect: set "
                "an admin key (--admin-key or RAYGATE_ADMIN_KEY), listen on 127.0.0.1, pass --closed-admin "
                "(RAYGATE_CLOSED_ADMIN=1) to refuse /admin, or pass "
                "--allow-open-admin (RAYGATE_ALLOW_OPEN_ADMIN=1) if the network is trusted"
            )
        warnings.append(
            f"/admin is open to anyone who can reach {settings.host}:{settings.port} (--allow-open-admin): "
            "they can deploy, replace and remove models"
        )
    if not api_keys_configured:
        warnings.append(
            f"/v1 is open to anyone who can reach {settings.host}:{settings.port}: no API keys are set "
            "(--api-key, RAYGATE_API_KEYS or --api-keys-file)"
        )
    return warnings
