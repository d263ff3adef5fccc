"""The baseline for "gateway alone": a bare ASGI app on the same uvicorn (uvloop + httptools) that
streams `max_tokens` SSE frames shaped like Raygate's completion chunks, with no framework, no
model, no Ray. The gateway's target is at least half its frames/s.

Two variants: under `/v1/...` one `send` (one socket write) per frame, as a hand-written streaming
endpoint, sse-starlette or llama_cpp.server do; under `/joined/v1/...` all frames in one `send`,
the most a single uvicorn stream can do (the ceiling for Raygate's frame joining).

    python -m bench.bare_app --port 8124
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store")]


def _frame(index: int, text: str, finish: str | None) -> bytes:
    chunk = {
        "id": "cmpl-bare",
        "object": "text_completion",
        "created": int(time.time()),
        "model": "bare",
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] == "GET":  # /health
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    tokens = int(json.loads(body).get("max_tokens") or 16)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    frames = (_frame(0, " tok", "length" if i == tokens else None) for i in range(1, tokens + 1))
    if scope["path"].startswith("/joined/"):
        await send({"type": "http.response.body", "body": b"".join(frames), "more_body": True})
    else:
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
