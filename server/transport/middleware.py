"""The gateway's one ASGI middleware: what happens to every HTTP request before and after a route.

Before: give the request an id (a sane `X-Request-Id` is kept, anything else replaced), refuse it
while draining (503), check its API key on `/v1/*` (401 / 429), refuse a body over the size limit
(413: at once from `Content-Length`, or as soon as a chunked body grows past it). After: add
`X-Request-Id` to the response, count it by endpoint and status, write the access log line, and
release what the request held (its admission slot), and append an admin action (anything but a
read under `/admin`, Xinference's registry changes, LoRA loads) or a batch cancel (under the key's
id) to the audit log. A keyed request whose key has a budget is checked against it before the
route (server/access/budgets.py: 429). With
tracing on, the request's span starts here (continuing a client's `traceparent`, whose successor
goes back in the response headers) and ends after the last byte (server/observability/tracing.py).
"After" means after the last byte of a streamed response: the middleware wraps the whole ASGI call.

It is pure ASGI rather than `BaseHTTPMiddleware`: a streamed response passes through untouched,
and "after" really is after the response, whatever the route returned.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from raygate.protocol.errors import OpenAIError, PayloadTooLargeError, ServiceUnavailableError
from raygate.server.access.admin_auth import is_admin_path
from raygate.server.access.auth import KeyStore
from raygate.server.access.budgets import Budgets
from raygate.server.context import BATCH_SCOPE_KEY, REQUEST_ID, SCOPE_KEY, RequestContext
from raygate.server.observability.ledger_writer import LedgerWriter
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.observability.tracing import Tracing
from raygate.server.transport.errors import error_response
from raygate.server.transport.lifecycle import Lifecycle

access_log = logging.getLogger("raygate.access")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
PROBES = frozenset({"/health", "/ready", "/metrics"})
# Xinference's client asks whether to send a key before it has one to send.
XINFERENCE_AUTH_PROBE = "/v1/cluster/auth"
# Model endpoints outside `/v1` (vLLM's tokenizer, Jina's and Cohere's v2 rerank): keyed like `/v1/*`.
KEYED_PATHS = frozenset({"/tokenize", "/detokenize", "/rerank", "/v2/rerank"})
READS = frozenset({"GET", "HEAD", "OPTIONS"})
# Audited actions by method and route; any other change under /admin is named `METHOD route`.
ACTIONS = {
    ("POST", "/admin/deployments"): "deploy",
    ("PATCH", "/admin/deployments/{name}"): "scale",
    ("PUT", "/admin/deployments/{name}"): "update",
    ("DELETE", "/admin/deployments/{name}"): "undeploy",
    ("DELETE", "/api/delete"): "undeploy",  # Ollama's verb for it
    ("POST", "/api/pull"): "deploy",  # and Ollama's for a Hub deploy
    ("POST", "/admin/keys"): "key.create",
    ("POST", "/admin/keys/{key_id}/rotate"): "key.rotate",
    ("DELETE", "/admin/keys/{key_id}"): "key.revoke",
    ("POST", "/v1/models"): "launch",
    ("DELETE", "/v1/models/{model_uid}"): "terminate",
    ("POST", "/v1/model_registrations/{model_type}"): "register",
    ("DELETE", "/v1/model_registrations/{model_type}/{model_name}"): "unregister",
    ("POST", "/v1/load_lora_adapter"): "adapter.load",
    ("POST", "/v1/unload_lora_adapter"): "adapter.unload",
    ("POST", "/admin/adapters"): "adapter.load",
    ("DELETE", "/admin/adapters/{name}"): "adapter.unload",
    ("POST", "/v1/batches/{batch_id}/cancel"): "batch.cancel",
}
# Actions any API key may take on what it owns, audited under the key's id rather than `admin`.
KEY_ACTIONS = frozenset({("POST", "/v1/batches/{batch_id}/cancel")})

# Ollama's API (server/routes/ollama.py) is keyed like `/v1/*`, but for the version its clients probe.
OLLAMA_PREFIX = "/api/"
OLLAMA_PROBE = "/api/version"


def is_keyed(path: str) -> bool:
    """Whether a request to `path` needs an API key (when keys are configured)."""
    if path == "/v1" or path.startswith("/v1/") or path in KEYED_PATHS:
        return path != XINFERENCE_AUTH_PROBE
    return path.startswith(OLLAMA_PREFIX) and path != OLLAMA_PROBE


# Uploads (`POST /v1/files`) have their own size limit, `--files-max-bytes`; the multipart form
# around the file may add this much.
FILES_PATH = "/v1/files"
MULTIPART_SLACK = 64 * 1024


def request_id_from(header: str | None) -> str:
    """Keep a client's id if it is short and plain (it ends up in logs and engine ids)."""
    if header is not None and _REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def close_connection(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with `Connection: close` (once): the server closes the connection after this response."""
    kept = [(name, value) for name, value in headers if name.lower() != b"connection"]
    return [*kept, (b"connection", b"close")]


class GatewayMiddleware:
    """The middleware of the module docstring: before the route, request id and refusals (drain, key, size);
    after the last byte, metrics, access log and cleanup."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: KeyStore,
        metrics: GatewayMetrics,
        lifecycle: Lifecycle,
        max_body_bytes: int,
        budgets: Budgets | None = None,
        audit: LedgerWriter | None = None,
        admin_actor: str = "anonymous",
        max_upload_bytes: int | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.lifecycle = lifecycle
        self.max_body_bytes = max_body_bytes
        self.budgets = budgets
        self.audit = audit
        self.admin_actor = admin_actor
        self.max_upload_bytes = max(max_body_bytes, (max_upload_bytes or 0) + MULTIPART_SLACK)
        self.tracing = tracing

    def _body_limit(self, scope: Scope) -> int:
        if scope["method"] == "POST" and scope["path"] == FILES_PATH:
            return self.max_upload_bytes
        return self.max_body_bytes

    def _refuse(self, scope: Scope, headers: Headers, ctx: RequestContext) -> OpenAIError | None:
        path: str = scope["path"]
        if path in PROBES:
            return None
        if self.lifecycle.draining:
            return ServiceUnavailableError("The server is shutting down.", code="server_shutting_down")
        if BATCH_SCOPE_KEY in scope:  # a batch line, run in this process with its owner's key
            ctx.batch = True
            ctx.key = scope[BATCH_SCOPE_KEY]
        elif (
            self.keys.enabled
            and is_keyed(path)
            and not is_admin_path(scope["method"], path)  # the admin key's, checked by the route
        ):
            try:
                ctx.key = self.keys.authenticate(
                    headers.getlist("authorization"), headers.getlist("x-api-key")
                )
            except OpenAIError as exc:
                self.metrics.rejected.inc({"model_name": "", "reason": str(exc.code)})
                return exc
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._body_limit(scope):
            return PayloadTooLargeError(self._too_large(scope))
        return None

    def _too_large(self, scope: Scope) -> str:
        return f"The request body is larger than this server's limit of {self._body_limit(scope)} bytes."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        headers = Headers(scope=scope)
        ctx = RequestContext(request_id_from(headers.get("x-request-id")), started=loop.time())
        scope[SCOPE_KEY] = ctx
        token = REQUEST_ID.set(ctx.request_id)
        status = 500
        received = 0
        limit = self._body_limit(scope)
        extra_headers = [(b"x-request-id", ctx.request_id.encode())]
        if self.tracing is not None and scope["path"] not in PROBES:
            carried = {name: headers[name] for name in ("traceparent", "tracestate") if name in headers}
            ctx.trace = self.tracing.start(scope["method"], scope["path"], carried, ctx.request_id)
            extra_headers.append((b"traceparent", ctx.trace.traceparent().encode()))

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), *extra_headers]
                if self.lifecycle.draining:  # no keep-alive while draining (transport/lifecycle.py)
                    message["headers"] = close_connection(message["headers"])
            await send(message)

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(
                        413, self._too_large(scope)
                    )  # -> server/transport/errors.py -> 413 body
            return message

        try:
            refusal = self._refuse(scope, headers, ctx)
            budgeted = ctx.key is not None and ctx.key.budget is not None and self.budgets is not None
            if refusal is None and budgeted and scope["method"] == "POST":
                assert self.budgets is not None
                try:
                    await self.budgets.admit(ctx)
                except OpenAIError as exc:
                    self.metrics.rejected.inc({"model_name": "", "reason": str(exc.code)})
                    refusal = exc
            if refusal is not None:
                response = error_response(refusal, path=scope["path"])
                await response(scope, receive, send_with_id)
                return
            if scope["path"] not in PROBES:
                self.lifecycle.contexts.add(ctx)
            await self.app(scope, receive_limited, send_with_id)
        finally:
            self.lifecycle.contexts.discard(ctx)
            ctx.close()
            self._account(scope, ctx, status, loop.time() - ctx.started)
            self._audit(scope, ctx, status)
            if ctx.trace is not None:
                ctx.trace.finish(ctx, getattr(scope.get("route"), "path", None), status)
            REQUEST_ID.reset(token)

    def _audit(self, scope: Scope, ctx: RequestContext, status: int) -> None:
        """Append an admin action to the audit log: who (the admin key, or nobody on an open
        /admin; `unauthenticated` when the key was wrong), what, on what, and how it ended."""
        method, path = scope["method"], scope["path"]
        if self.audit is None or method in READS:
            return
        route = getattr(scope.get("route"), "path", None) or path
        by_key = (method, route) in KEY_ACTIONS
        if not (by_key or path.startswith("/admin/") or is_admin_path(method, path)):
            return
        params = scope.get("path_params") or {}
        target = ctx.audit_target or "/".join(str(v) for v in params.values()) or path
        if status == 401:
            actor = "unauthenticated"
        elif by_key:
            actor = ctx.key.id if ctx.key is not None else "anonymous"
        else:
            actor = self.admin_actor
        self.audit.audit(
            {
                "at": time.time(),
                "actor": actor,
                "action": ACTIONS.get((method, route), f"{method} {route}")[:64],
                "target": target[:512],
                "status": status,
                "outcome": "ok" if status < 400 else "refused" if status in (401, 403) else "failed",
                "request_id": ctx.request_id,
            }
        )

    def _account(self, scope: Scope, ctx: RequestContext, status: int, seconds: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "unmatched"
        self.metrics.http_requests.inc(
            {"endpoint": endpoint, "status": str(status), "model_name": ctx.model or ""}
        )
        level = logging.DEBUG if scope["path"] in PROBES else logging.INFO
        if access_log.isEnabledFor(level):
            access_log.log(
                level,
                "%s %s %d %.1fms model=%s key=%s",
                scope["method"],
                scope["path"],
                status,
                seconds * 1000,
                ctx.model or "-",
                ctx.key.name if ctx.key else "-",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round(seconds * 1000, 1),
                    "model": ctx.model,
                    "key_name": ctx.key.name if ctx.key else None,
                },
            )
