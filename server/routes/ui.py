"""`/ui`: the web console, a few static files shipped inside the package (server/ui/).

The page is public and holds no secret: every call it makes goes to the API with the keys the user
types in (the admin key for `/admin`, an API key for `/v1`), kept in the tab's `sessionStorage`.
Every response here carries a Content-Security-Policy that allows only this origin's own scripts,
styles and connections: no inline script, no CDN, no framing.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException

router = APIRouter(include_in_schema=False)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
ASSETS = resources.files("raygate.server") / "ui"


def _asset(name: str) -> Response:
    suffix = name[name.rfind(".") :] if "." in name else ""
    # Only plain names of the shipped files: no path separators, no dot-files.
    if "/" in name or "\\" in name or name.startswith(".") or suffix not in TYPES:
        raise HTTPException(404, f"No console file `{name[:60]}`.")
    entry = ASSETS / name
    if not entry.is_file():
        raise HTTPException(404, f"No console file `{name[:60]}`.")
    return Response(entry.read_bytes(), media_type=TYPES[suffix], headers=HEADERS)


@router.get("/ui")
async def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/")
async def ui_index() -> Response:
    return _asset("index.html")


@router.get("/ui/{name}")
async def ui_file(name: str) -> Response:
    return _asset(name)
