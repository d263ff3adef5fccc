"""`raygate batch submit | list | status | cancel | results`: the Batch API from the terminal.

Plain HTTP to `/v1/files` and `/v1/batches` with the API key of `--api-key` / RAYGATE_API_KEY
(the key that owns the batch: another key sees none of it). `submit --wait` polls the batch and
draws a progress bar on stderr until it ends, then prints the batch as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from raygate.client.http import ClientError, add_url_option, checked

FINAL = ("completed", "failed", "expired", "cancelled")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
BAR_WIDTH = 30


def add_batch_commands(sub: Any) -> None:
    keyed = argparse.ArgumentParser(add_help=False)
    add_url_option(keyed)
    keyed.add_argument(
        "--api-key",
        default=os.environ.get("RAYGATE_API_KEY") or None,
        help="API key for /v1 if the gateway wants one (env RAYGATE_API_KEY); it owns the batch",
    )
    batch = sub.add_parser("batch", help="submit and follow batches (the Batch API)")
    commands = batch.add_subparsers(dest="batch_command", required=True, metavar="COMMAND")

    submit = commands.add_parser(
        "submit", parents=[keyed], help="upload a JSONL file of requests and start a batch"
    )
    submit.add_argument("file", type=Path, help="JSONL: one {custom_id, method, url, body} per line")
    submit.add_argument("--endpoint", required=True, choices=ENDPOINTS)
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--wait", action="store_true", help="follow it with a progress bar until it ends")
    submit.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds --wait waits")

    listing = commands.add_parser("list", parents=[keyed], help="this key's batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--json", action="store_true", help="print the raw JSON")

    for name, text in (("status", "one batch as JSON"), ("cancel", "cancel a batch (what finished is kept)")):
        one = commands.add_parser(name, parents=[keyed], help=text)
        one.add_argument("batch_id")

    results = commands.add_parser(
        "results", parents=[keyed], help="print a batch's output file (JSONL), or its error file"
    )
    results.add_argument("batch_id")
    results.add_argument("--errors", action="store_true", help="the error file instead")
    results.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")


def run_batch(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    commands = {"submit": _submit, "list": _list, "status": _status, "cancel": _cancel, "results": _results}
    try:
        with httpx.Client(
            base_url=args.url.rstrip("/"), headers=headers, timeout=httpx.Timeout(120.0)
        ) as http:
            return commands[args.batch_command](http, args)
    except ClientError as exc:
        print(f"raygate: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"raygate: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1


def _call(http: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response:
    return checked(http, method, path, **kw)


def _submit(http: httpx.Client, args: argparse.Namespace) -> int:
    try:
        content = args.file.read_bytes()
    except OSError as exc:
        raise ClientError(f"cannot read {args.file}: {exc.strerror}") from None
    metadata = {}
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ClientError(f"--metadata wants KEY=VALUE, got `{item}`")
        metadata[key] = value
    uploaded = _call(
        http, "POST", "/v1/files", files={"file": (args.file.name, content)}, data={"purpose": "batch"}
    ).json()
    body: dict[str, Any] = {
        "input_file_id": uploaded["id"],
        "endpoint": args.endpoint,
        "completion_window": "24h",
    }
    if metadata:
        body["metadata"] = metadata
    batch = _call(http, "POST", "/v1/batches", json=body).json()
    print(f"batch {batch['id']}: {batch['status']}", file=sys.stderr)
    if args.wait:
        batch = _follow(http, batch, args.timeout)
    print(json.dumps(batch, indent=2))
    return 0 if batch["status"] in ("in_progress", "validating", "completed") else 1


def _follow(http: httpx.Client, batch: dict[str, Any], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    tty = sys.stderr.isatty()
    last = ""
    while batch["status"] not in FINAL:
        if time.monotonic() > deadline:
            raise ClientError(f"batch {batch['id']} still {batch['status']} after {timeout:g} s")
        line = progress(batch)
        if line != last:
            print(("\r" if tty else "") + line, end="" if tty else "\n", file=sys.stderr, flush=True)
            last = line
        time.sleep(1.0)
        batch = _call(http, "GET", f"/v1/batches/{batch['id']}").json()
    print(("\r" if tty else "") + progress(batch), file=sys.stderr)
    return batch


def progress(batch: dict[str, Any]) -> str:
    """`[#####.....]  12/100 done (1 failed) in_progress`: finished lines of all."""
    counts = batch.get("request_counts") or {}
    total, completed, failed = counts.get("total", 0), counts.get("completed", 0), counts.get("failed", 0)
    done = completed + failed
    filled = BAR_WIDTH * done // total if total else 0
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    return f"[{bar}] {done:>{len(str(total))}}/{total} done ({failed} failed) {batch['status']}"


def _list(http: httpx.Client, args: argparse.Namespace) -> int:
    page = _call(http, "GET", "/v1/batches", params={"limit": args.limit}).json()
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    if not page["data"]:
        print("no batches")
    for batch in page["data"]:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(batch["created_at"]))
        print(f"{batch['id']}  {created}  {batch['endpoint']:<20}  {progress(batch)}")
    return 0


def _status(http: httpx.Client, args: argparse.Namespace) -> int:
    print(json.dumps(_call(http, "GET", f"/v1/batches/{args.batch_id}").json(), indent=2))
    return 0


def _cancel(http: httpx.Client, args: argparse.Namespace) -> int:
    batch = _call(http, "POST", f"/v1/batches/{args.batch_id}/cancel").json()
    print(f"batch {batch['id']}: {batch['status']}")
    return 0


def _results(http: httpx.Client, args: argparse.Namespace) -> int:
    batch = _call(http, "GET", f"/v1/batches/{args.batch_id}").json()
    file_id = batch["error_file_id" if args.errors else "output_file_id"]
    if file_id is None:
        what = "errors" if args.errors else "output"
        if batch["status"] not in FINAL:
            raise ClientError(f"batch {batch['id']} is {batch['status']}: no {what} file yet")
        print(f"batch {batch['id']} ({batch['status']}) has no {what} file", file=sys.stderr)
        return 0
    content = _call(http, "GET", f"/v1/files/{file_id}/content").content
    if args.output is not None:
        args.output.write_bytes(content)
        print(f"wrote {len(content)} bytes to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(content.decode())
    return 0
