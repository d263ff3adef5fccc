"""HTTP plumbing below and around the routes: the one ASGI middleware (request id, key, body size,
access log), limits on the request head and on stalled writers (`http_limits`, `write_stall`),
exceptions as each API's error body (`errors`), unknown-field logging and graceful shutdown
(`lifecycle`). Nothing here knows a model or an endpoint's semantics; the request's own record
(`server/context.py`) sits below every room, since logs and the serving layer read it too."""
