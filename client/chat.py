"""`raygate chat`: one prompt streamed from a running gateway's `/v1/chat/completions` to the
terminal, token by token.

Its own module because it is the one client command of the OpenAI API rather than `/admin`: it
sends the API key (not the admin key), waits out a model that is still loading (503 with
Retry-After), and reads server-sent events.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

from raygate.client.http import ClientError


def add_chat_command(sub: Any, common: argparse.ArgumentParser) -> None:
    chat = sub.add_parser("chat", parents=[common], help="stream a chat answer to the terminal")
    chat.add_argument("model")
    chat.add_argument("prompt")
    chat.add_argument("--system", help="system message")
    chat.add_argument("--max-tokens", type=int, default=256)
    chat.add_argument("--temperature", type=float)
    chat.add_argument(
        "--api-key",
        default=os.environ.get("RAYGATE_API_KEY") or None,
        help="API key for /v1 if the gateway wants one (env RAYGATE_API_KEY)",
    )
    chat.add_argument(
        "--wait",
        type=float,
        default=300.0,
        help="seconds to keep retrying while the model loads (default: %(default)s)",
    )


def run_chat(http: httpx.Client, args: argparse.Namespace) -> int:
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    body: dict[str, Any] = {
        "model": args.model,
        "messages": messages,
        "stream": True,
        "max_tokens": args.max_tokens,
    }
    if args.temperature is not None:
        body["temperature"] = args.temperature
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    deadline = time.monotonic() + args.wait
    while True:
        with http.stream("POST", "/v1/chat/completions", json=body, headers=headers, timeout=None) as r:
            if r.status_code == 503 and "retry-after" in r.headers and time.monotonic() < deadline:
                r.read()
                print(f"{args.model} is loading; retrying", file=sys.stderr, flush=True)
                time.sleep(float(r.headers["retry-after"]))
                continue
            if r.status_code >= 400:
                r.read()
                try:
                    message = r.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = r.text[:500]
                raise ClientError(f"{r.status_code}: {message}")
            for text in _deltas(r.iter_lines()):
                sys.stdout.write(text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        return 0


def _deltas(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise ClientError(f"stream failed: {chunk['error'].get('message')}")
        for choice in chunk.get("choices", []):
            yield choice.get("delta", {}).get("content") or ""
