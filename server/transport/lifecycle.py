"""Graceful shutdown: SIGTERM drains the gateway before uvicorn stops it.

uvicorn on its own closes the listening socket at once, so a load balancer that has not yet noticed
the shutdown gets connection errors. Here the first SIGTERM (or Ctrl-C) only starts a *drain*:

1. `/ready` answers 503 and new requests get 503 + `Connection: close`, while the socket stays
   open, so clients and balancers see a clear answer;
   every response that starts from then on says `Connection: close` (closing idle kept-alive
   connections at once with uvicorn's `shutdown()` stalled a stream in flight through a
   container's port forwarding until the drain timeout: not done). Otherwise a client's next
   request (a POST, which no client retries) could go out on a kept-alive connection just as
   step 4 closes it, and it would see a bare connection error instead of an answer;
2. in-flight requests (streams included) have `drain_timeout_s` to finish normally;
3. those still running then end with an error (an in-band error event + `[DONE]` for a stream
   whose headers are out, 503 otherwise), and the engine requests are cancelled;
4. uvicorn's own shutdown runs: the socket closes, the lifespan releases the Ray replicas, and the
   process exits 0.

A second signal skips the drain (uvicorn's force exit). sse-starlette cancels streams as soon as
uvicorn's `should_exit` is set; since that happens only at step 4, it never cuts a stream short.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from types import FrameType

import uvicorn

from raygate.protocol.errors import ServiceUnavailableError
from raygate.server.context import RequestContext

log = logging.getLogger(__name__)

# After the drain timeout, how long ended requests get to send their error event.
STOP_GRACE_S = 5.0


@dataclass(eq=False)
class Lifecycle:
    """The drain's state, shared by the signal handler, the middleware and uvicorn's tick: whether draining,
    which requests are in flight, and when to end them."""

    drain_timeout_s: float
    draining: bool = False
    contexts: set[RequestContext] = field(default_factory=set)
    _drain_started: float = 0.0
    _stopped_at: float | None = None

    def begin_drain(self) -> None:
        """Called from a signal handler: only set flags (the event loop does the rest)."""
        if not self.draining:
            self.draining = True
            self._drain_started = time.monotonic()

    def poll(self) -> bool:
        """Advance the drain; True once the server may shut down. Runs on the event loop."""
        if not self.draining:
            return False
        if not self.contexts:
            return True
        now = time.monotonic()
        if self._stopped_at is None and now - self._drain_started >= self.drain_timeout_s:
            self._stopped_at = now
            log.warning("drain timeout: ending %d request(s) still in flight", len(self.contexts))
            for ctx in list(self.contexts):
                ctx.stop(
                    ServiceUnavailableError(
                        "The server is shutting down; the request was not completed.",
                        code="server_shutting_down",
                    )
                )
        return self._stopped_at is not None and now - self._stopped_at >= STOP_GRACE_S


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain step in front of its shutdown (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining or not self.started:
            super().handle_exit(sig, frame)  # second signal, or not serving yet: stop now
            return
        log.info(
            "%s received: draining (up to %.0f s)", signal.Signals(sig).name, self.lifecycle.drain_timeout_s
        )
        self.lifecycle.begin_drain()

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit and self.lifecycle.poll():
            log.info("drain complete; shutting down")
            self.should_exit = True
        return await super().on_tick(counter)
