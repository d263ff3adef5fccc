"""Dropping a client that reads nothing: a connection whose writes have been stalled too long.

With backpressure on the stream path (issue #12), a client that opens a stream and never reads
holds its engine request (and the single decode thread of a llama.cpp replica) for as long as the
connection stays open. This bounds that: once the socket buffer is full, the transport asks the
protocol to pause writing (asyncio's flow control, above its 64 KiB high-water mark). From then
on, every `stall_timeout` seconds the protocol looks at what is still buffered: if the socket took
nothing in that time (the buffer did not shrink), the connection is aborted. A client that reads
slowly keeps its stream (a large write can keep the transport paused for long, yet it drains).
"Took nothing" is as the kernel reports it: a TCP socket says it has room again only once about
half of its send buffer (which Linux grows to a few MB) has drained, so with a 5 s timeout a client
reading 128 KB/s was dropped here, one reading 640 KB/s was not; the 60 s default asks a reader
for roughly 25 KB/s.

Why here and not around each SSE write: the protocol is told when writing blocks and when it can
go on, so the timer runs only while a client is actually not reading; nothing is added to the
per-token path (a timeout around each send would arm a timer per write). `transport.abort()`
discards what is buffered (`close()` would keep it until the client reads it, i.e. never) and
uvicorn's `connection_lost` reports `http.disconnect`, so the stream ends the way a client
disconnect does: the SSE body closes, then the Ray stream, and the engine aborts the request.
Every response gets this, not only streams: a large JSON body sent to a client that never reads
is just as stuck.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class WriteStallLimit:
    """Mixin over a uvicorn HTTP/1.1 protocol (it relies on `transport`, `loop` and uvicorn's
    `pause_writing` / `resume_writing` / `connection_lost`, which both implementations have)."""

    stall_timeout: float = 60.0

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _stall_timer: asyncio.TimerHandle | None = None
    _stall_buffered = 0  # bytes buffered when the timer was (re)armed

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._stall_timer is None and self.stall_timeout > 0:
            self._arm_stall_timer()

    def _arm_stall_timer(self) -> None:
        self._stall_buffered = self.transport.get_write_buffer_size()
        self._stall_timer = self.loop.call_later(self.stall_timeout, self._write_stalled)

    def resume_writing(self) -> None:
        self._cancel_stall_timer()
        super().resume_writing()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_stall_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _cancel_stall_timer(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _write_stalled(self) -> None:
        self._stall_timer = None
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size() < self._stall_buffered:
            self._arm_stall_timer()  # the client read something meanwhile: slow, not gone
            return
        peer = self.transport.get_extra_info("peername")
        log.warning(
            "dropping client %s: it has read nothing for %gs (--stream-stall-timeout)",
            peer,
            self.stall_timeout,
        )
        self.transport.abort()
