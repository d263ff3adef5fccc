"""What every `raygate` client command shares: the gateway's address, and an HTTP call whose
refusal becomes one printable error (the API's own message)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class ClientError(RuntimeError):
    """What to print before exiting 1."""


def add_url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("RAYGATE_URL", DEFAULT_URL),
        help="gateway to talk to (env RAYGATE_URL; default: %(default)s)",
    )


def checked(http: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response:
    """The response; a 4xx/5xx raises ClientError with the error body's message."""
    r = http.request(method, path, **kw)
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:500]
        raise ClientError(f"{r.status_code}: {message}")
    return r


def checked_json(http: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    """The checked response's JSON body: what the `/admin` commands read."""
    return checked(http, method, path, **kw).json()
