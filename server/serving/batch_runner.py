"""The batch runner: a task in each gateway that claims batch lines from the batch store and runs
them as requests to this gateway's own routes, at the lowest admission priority.

Where it lives, and why: batch *state* is the stores actor's (`backends/cluster/stores/batches.py`,
placed with the controller, persisted under `--state-dir`), so it outlives every gateway; the
*work* is done by gateways, because that is where the serving layer is. A line is one in-process
ASGI request to the app (`POST /v1/chat/completions` with the line's body), through the same
middleware, route, serving class and `ModelHandle` as a client's request: the same validation,
model resolution, key checks, defaults, deadlines and metrics, and no second generation path.
The request's scope carries the batch owner's key (`context.BATCH_SCOPE_KEY`), which marks it as
a batch line: admission (`admission.py`) starts it only while no interactive request waits for
the model, and it is not charged to the key's rate limit.

Claims are leases (`--batch-lease`), renewed while the line runs: a runner that dies leaves its
lines to lapse back to the store, where any gateway's runner (or this one, restarted) takes them;
a gateway that stops cleanly lets its in-flight lines finish during the drain and hands back the
rest. A line's result is recorded in the store before it counts (`BatchDB.finish`), and a result
from a runner that lost its lease is dropped, so no line is recorded twice or lost. A line that
fails with a server error (5xx: a replica died under it) runs once more, then its error is kept.

Before claiming, the runner also looks at this gateway's admission gates: while any interactive
request waits for a slot, it claims nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message

from raygate.backends.cluster.stores.batch_lines import ClaimedLine, LineResult
from raygate.backends.cluster.stores.batches import BatchStoreClient
from raygate.protocol.errors import AuthenticationError, EngineError, OpenAIError
from raygate.server.access.auth import KeyStore
from raygate.server.context import BATCH_SCOPE_KEY
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.serving.admission import Admission
from raygate.server.transport.errors import error_body
from raygate.server.transport.lifecycle import Lifecycle

log = logging.getLogger(__name__)

# How often an idle runner looks for new lines, and how often it checks expiries and cancels.
POLL_S = 1.0
TICK_S = 2.0
# The endpoints whose bodies take `stream`: a batch line's answer is always one body.
_STREAMING = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})


class BatchRunner:
    """Claims and runs batch lines, at most `max_running` at once (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        store: BatchStoreClient,
        *,
        keys: KeyStore,
        admission: Admission,
        lifecycle: Lifecycle,
        metrics: GatewayMetrics,
        max_running: int,
        lease_s: float,
    ) -> None:
        self._app = app
        self._store = store
        self._keys = keys
        self._admission = admission
        self._lifecycle = lifecycle
        self._metrics = metrics
        self._max_running = max_running
        self._lease_s = lease_s
        self.id = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._running: dict[asyncio.Task[None], tuple[str, int]] = {}  # task -> (batch id, line)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch-runner")

    def wake(self) -> None:
        """Look for lines now (a batch was just created)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming, end the lines still running (their requests see a disconnect, which
        aborts the engine requests) and hand them back to the store for the next runner."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._store.release(self.id), 10)

    def _interactive_waiting(self) -> bool:
        return any(gate.interactive_waiting for gate in self._admission.gates.values())

    async def _loop(self) -> None:
        last_tick = last_renew = 0.0
        while True:
            try:
                now = time.monotonic()
                if now - last_tick >= TICK_S:
                    await self._store.tick()
                    await self._observe()
                    last_tick = now
                if self._running and now - last_renew >= self._lease_s / 3:
                    await self._store.renew(self.id, list(self._running.values()), self._lease_s)
                    last_renew = now
                claimed = await self._claim()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch runner: the batch store failed; trying again")
                claimed = 0
            if not claimed:
                await self._idle()

    async def _claim(self) -> int:
        free = self._max_running - len(self._running)
        if free <= 0 or self._lifecycle.draining or self._interactive_waiting():
            return 0
        lines = await self._store.claim(self.id, free, self._lease_s)
        for line in lines:
            task = asyncio.create_task(self._run(line), name=f"batch-line-{line.batch_id}-{line.index}")
            self._running[task] = (line.batch_id, line.index)
            task.add_done_callback(self._done)
        return len(lines)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("batch line failed", exc_info=task.exception())

    async def _idle(self) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), POLL_S)

    async def _observe(self) -> None:
        """The batches gauge, by status (every gateway reports the cluster's counts)."""
        counts = await self._store.status_counts()
        for status, count in counts.items():
            self._metrics.batches.set({"status": status}, count)

    async def _run(self, line: ClaimedLine) -> None:
        try:
            result = await self._execute(line)
        except Exception as exc:  # a bug here must not leave the line claimed (and renewed) forever
            log.exception("batch %s line %d failed in the runner", line.batch_id, line.index)
            failed = EngineError(
                f"The batch line could not be run: {type(exc).__name__}.", code="batch_runner"
            )
            result = LineResult(failed.status_code, "-", error_body(failed))
        if result is None:  # stopped mid-line: handed back to the store by `stop`
            return
        outcome = await self._store.finish(self.id, line.batch_id, line.index, result)
        if outcome == "retry":
            self._metrics.batch_lines.inc({"outcome": "retried"})
        elif outcome == "recorded":
            self._metrics.batch_lines.inc({"outcome": "completed" if result.ok else "failed"})
        else:
            log.warning(
                "batch %s line %d: result dropped (lease lost or batch ended)", line.batch_id, line.index
            )

    async def _execute(self, line: ClaimedLine) -> LineResult | None:
        """The line as one request to this app, or None if the runner stopped under it."""
        request_id = f"batch_req_{uuid.uuid4().hex}"
        key = self._keys.by_owner(line.owner) if line.owner else None
        if self._keys.enabled and key is None:
            refused = AuthenticationError("The API key that created this batch is no longer configured.")
            return LineResult(refused.status_code, request_id, error_body(refused))
        body = dict(line.body)
        if line.url in _STREAMING:
            body["stream"] = False
        raw = json.dumps(body).encode()  # ASCII: a lone surrogate reaches the route's own check
        unread = [raw]
        status = 500
        chunks: list[bytes] = []

        async def receive() -> Message:
            if unread:
                return {"type": "http.request", "body": unread.pop(), "more_body": False}
            await self._stopping.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self._app(_scope(line.url, len(raw), request_id, key), receive, send)
        except OpenAIError as exc:  # normally answered by the app's handlers; kept for safety
            return LineResult(exc.status_code, request_id, error_body(exc))
        if self._stopping.is_set():
            return None
        payload = b"".join(chunks)
        try:
            answer = json.loads(payload) if payload else {}
        except ValueError:
            answer = {"error": {"message": payload.decode(errors="replace")[:1000], "type": "server_error"}}
        if not isinstance(answer, dict):
            answer = {"data": answer}
        return LineResult(status, request_id, answer)


def _scope(path: str, length: int, request_id: str, key: Any) -> dict[str, Any]:
    """The ASGI scope of a batch line's request (what uvicorn would build for a client's)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(length).encode()),
            (b"x-request-id", request_id.encode()),
        ],
        "client": ("batch", 0),
        "server": ("raygate", 0),
        "state": {},
        BATCH_SCOPE_KEY: key,
    }
