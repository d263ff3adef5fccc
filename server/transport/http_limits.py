"""Limits on the request head (request line + headers), below the ASGI app.

uvicorn's httptools protocol (what "auto" picks when httptools is installed) reads a request head of
any size: a 32 MB header was read in full before the 401. Neither protocol bounds the time a head may
take: a client that opens a connection and sends nothing, or trickles a header byte now and then,
holds it open forever (uvicorn's keep-alive timeout only runs *between* requests).

`limited_protocol()` returns uvicorn's protocol class with two limits added, whichever parser it
uses (the same one "auto" would pick):

* a head larger than `max_header_bytes` is answered `431` (OpenAI's error body) and the connection
  closed; at most one socket read (256 KiB) past the limit is ever buffered;
* a head not complete `header_timeout` seconds after the connection opened (or after the first
  byte of the next request, on a kept-alive connection) is answered `408`, or
  the connection is simply closed when nothing at all was sent.

Between requests uvicorn's own `timeout_keep_alive` closes idle connections. A client that stops
reading a response is dropped by the third limit composed here (`server/transport/write_stall.py`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from raygate.protocol.errors import OpenAIError
from raygate.server.transport.write_stall import WriteStallLimit

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _raw_response(status: int, error: OpenAIError) -> bytes:
    body = json.dumps(error.to_body()).encode()
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class _HeadLimits:
    """Mixin over a uvicorn HTTP/1.1 protocol (it relies on `cycle`, `cycle.more_body`,
    `transport` and `loop`, which both of uvicorn's implementations have)."""

    max_header_bytes: int = 64 * 1024
    header_timeout: float = 10.0

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._head_bytes = 0
        self._head_cycle: Any = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._begin_head()

    def _begin_head(self) -> None:
        self._head_bytes = 0
        self._head_cycle = self.cycle
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_expired)

    def _end_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _reading_head(self) -> bool:
        """Bytes arriving now start or continue a request head: no request yet, or the current
        one's body has been read to its end (what comes next is the next request)."""
        return self.cycle is None or not self.cycle.more_body

    def data_received(self, data: bytes) -> None:
        if not self._reading_head():
            super().data_received(data)  # type: ignore[misc]
            return
        if self._head_timer is None:
            self._begin_head()
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing() or self.cycle is not self._head_cycle:  # refused, or a head parsed
            self._end_head()
        else:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    "The request headers are larger than this server's limit of "
                    f"{self.max_header_bytes} bytes.",
                    "request_header_fields_too_large",
                )

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.cycle is not self._head_cycle:
            return
        if self._head_bytes == 0 and self.cycle is None:
            self.transport.close()  # never said anything: nobody to answer
            return
        self._refuse(
            408,
            f"The request headers did not arrive within {self.header_timeout:g} seconds.",
            "request_timeout",
        )

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._end_head()
        err = OpenAIError(message, code=code)
        err.error_type = "invalid_request_error"
        self.transport.write(_raw_response(status, err))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)  # type: ignore[misc]


def limited_protocol(
    max_header_bytes: int, header_timeout: float, stall_timeout: float = 60.0
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol class (httptools if installed, else h11, as "auto" picks) with
    the head limits above and the write-stall limit (0 turns that one off)."""
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base  # noqa: N813
    except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
        from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]  # noqa: N813

    return type(
        f"Limited{base.__name__}",
        (_HeadLimits, WriteStallLimit, base),
        {
            "max_header_bytes": max_header_bytes,
            "header_timeout": header_timeout,
            "stall_timeout": stall_timeout,
        },
    )
