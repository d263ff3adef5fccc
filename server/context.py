"""What the gateway knows about one HTTP request while it runs: its id, when it arrived, who sent it
(the API key's name, never the key), which model it reached, and how to stop it.

Stopping works through `asyncio.Timeout` scopes rather than tasks: every wait on the engine (the
admission queue, each next delta) runs under a timeout at the request's deadline, and draining the
server reschedules those timeouts to *now*. That costs nothing per token and needs no extra task.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from raygate.protocol.errors import OpenAIError

if TYPE_CHECKING:
    from starlette.requests import Request

    from raygate.server.access.auth import ApiKey

T = TypeVar("T")
SCOPE_KEY = "raygate.context"
# Set in the ASGI scope of a batch line's in-process request (server/serving/batch_runner.py): the
# API key that owns the batch (an `ApiKey`, or None on an open gateway). Only code in the gateway's
# process can put it there, never a client.
BATCH_SCOPE_KEY = "raygate.batch_key"

# The request id of the request the current task serves, for log records (server/observability/logs.py). A
# context variable is per task, so concurrent requests never see each other's id.
REQUEST_ID: ContextVar[str] = ContextVar("raygate_request_id", default="-")

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RequestContext:
    """One request's state, shared by the middleware, the routes and the serving layer. Every engine wait goes
    through `bounded()`, so deadlines and the drain stop reach it."""

    request_id: str
    started: float  # loop time at arrival: timeouts and latencies count from here
    key: ApiKey | None = None
    model: str | None = None
    # Admission's order (server/serving/admission.py): vLLM's `priority` (None: the key's default),
    # and whether this is a batch line (the lowest class).
    priority: int | None = None
    batch: bool = False
    stop_error: OpenAIError | None = None
    # What an admin action acted on, when its path does not say (a deploy names its model in the body).
    audit_target: str | None = None
    # The request's OpenTelemetry span: a `server.observability.tracing.RequestTrace` (typed Any:
    # access/, below observability/ in the layers, reads this module); None: tracing is off.
    trace: Any = None
    _timeouts: set[asyncio.Timeout] = field(default_factory=set)
    _cleanups: list[Callable[[], None]] = field(default_factory=list)

    def on_close(self, cleanup: Callable[[], None]) -> None:
        """Run `cleanup` once the response has been sent completely (or the request failed)."""
        self._cleanups.append(cleanup)

    def close(self) -> None:
        cleanups, self._cleanups = self._cleanups, []
        for cleanup in cleanups:
            try:
                cleanup()
            except Exception:
                log.exception("request cleanup failed")

    def stop(self, error: OpenAIError) -> None:
        """End whatever the request is waiting for with `error` (used when the drain times out)."""
        self.stop_error = error
        now = asyncio.get_running_loop().time()
        for timeout in list(self._timeouts):
            timeout.reschedule(now)

    async def bounded(
        self, awaitable: Awaitable[T], deadline: float | None, on_timeout: Callable[[], OpenAIError]
    ) -> T:
        """Await `awaitable` until `deadline` (loop time; None: no limit) or until `stop()`.

        On expiry the awaitable is cancelled, which closes an engine stream inside it: that is how a
        timeout aborts the engine request.
        """
        if self.stop_error is not None:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise copy.copy(self.stop_error)
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                self._timeouts.add(timeout)
                try:
                    return await awaitable
                finally:
                    self._timeouts.discard(timeout)
        except TimeoutError:
            if not timeout.expired():
                raise
            if self.stop_error is not None:
                raise copy.copy(self.stop_error) from None
            raise on_timeout() from None


def request_context(request: Request) -> RequestContext:
    """The context the gateway middleware attached; a bare one if the app runs without it."""
    ctx = request.scope.get(SCOPE_KEY)
    if ctx is None:
        ctx = RequestContext(request_id="-", started=asyncio.get_running_loop().time())
        request.scope[SCOPE_KEY] = ctx
    assert isinstance(ctx, RequestContext)
    return ctx
