"""`raygate usage | keys | audit`: the ledger through the gateway's `/admin` API (HTTP only).

`raygate keys create` prints the new key's secret once (the gateway keeps only its digest): store
it then, or rotate the key later for a new one.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

Call = Callable[..., Any]


def add_ledger_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    usage = sub.add_parser(
        "usage",
        parents=[common],
        help="token usage per key, model and day",
        description="Token usage recorded by every gateway of the namespace (GET /admin/usage).",
    )
    usage.add_argument("--key-id", help="only this key (`anonymous`: requests without a key)")
    usage.add_argument("--model", help="only this model")
    usage.add_argument("--since", help="Unix seconds or ISO 8601 date / date-time (inclusive)")
    usage.add_argument("--until", help="Unix seconds or ISO 8601 date / date-time (exclusive)")
    usage.add_argument(
        "--group-by",
        default="key,model,day",
        help="comma-separated key, model, day, endpoint (default: %(default)s)",
    )
    usage.add_argument("--json", action="store_true", help="print the raw JSON")

    keys = sub.add_parser("keys", parents=[common], help="API keys kept in the gateway's database")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[common], help="create a key; prints its secret once")
    create.add_argument("name")
    create.add_argument("--model", action="append", default=None, help="a model it may use (repeatable)")
    create.add_argument("--tokens-per-day", type=int)
    create.add_argument("--tokens-per-month", type=int)
    create.add_argument("--max-parallel", type=int)
    create.add_argument("--requests-per-minute", type=float)
    create.add_argument("--expires-in", type=float, metavar="SECONDS", help="refuse the key after this long")
    listing = actions.add_parser("list", parents=[common], help="list keys (never their secrets)")
    listing.add_argument("--json", action="store_true", help="print the raw JSON")
    rotate = actions.add_parser("rotate", parents=[common], help="a new secret for a key; prints it once")
    rotate.add_argument("id")
    revoke = actions.add_parser("revoke", parents=[common], help="revoke a key on every gateway")
    revoke.add_argument("id")

    audit = sub.add_parser("audit", parents=[common], help="the admin actions' audit log, newest first")
    audit.add_argument("--since", help="Unix seconds or ISO 8601 date / date-time")
    audit.add_argument("--limit", type=int, default=50)
    audit.add_argument("--json", action="store_true", help="print the raw JSON")


def table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def usage(http: httpx.Client, args: argparse.Namespace, call: Call) -> int:
    params = {
        k: v
        for k, v in {
            "group_by": args.group_by,
            "key_id": args.key_id,
            "model": args.model,
            "since": args.since,
            "until": args.until,
        }.items()
        if v is not None
    }
    report = call(http, "GET", "/admin/usage", params=params)
    if args.json:
        print(json.dumps(report["data"], indent=2))
        return 0
    groups = [{"key": "key_id"}.get(g, g) for g in report["group_by"]]
    counts = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens")
    rows = [tuple(c.upper() for c in (*groups, *counts))]
    rows += [tuple(str(r[c]) for c in (*groups, *counts)) for r in report["data"]]
    table(rows)
    return 0


def keys(http: httpx.Client, args: argparse.Namespace, call: Call) -> int:
    if args.keys_command == "create":
        budget = {
            "tokens_per_day": args.tokens_per_day,
            "tokens_per_month": args.tokens_per_month,
            "max_parallel": args.max_parallel,
        }
        body = {
            "name": args.name,
            "models": args.model,
            "requests_per_minute": args.requests_per_minute,
            "budget": {k: v for k, v in budget.items() if v is not None},
            "expires_in_s": args.expires_in,
        }
        created = call(http, "POST", "/admin/keys", json={k: v for k, v in body.items() if v is not None})
        print(f"created {created['id']} ({created['name']}); the secret, shown only now:\n{created['key']}")
        return 0
    if args.keys_command == "rotate":
        rotated = call(http, "POST", f"/admin/keys/{args.id}/rotate")
        print(f"rotated {rotated['id']}; the new secret, shown only now:\n{rotated['key']}")
        return 0
    if args.keys_command == "revoke":
        revoked = call(http, "DELETE", f"/admin/keys/{args.id}")
        print(f"revoked {revoked['id']} ({revoked['name']})")
        return 0
    data = call(http, "GET", "/admin/keys")["data"]
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [("ID", "NAME", "STATE", "MODELS", "TOKENS/DAY", "TOKENS/MONTH", "PARALLEL", "EXPIRES")]
    for k in data:
        b = k["budget"]
        expires = "-" if k["expires_at"] is None else _when(k["expires_at"])
        rows.append(
            (
                k["id"],
                k["name"],
                k["state"],
                ",".join(k["models"]) if k["models"] is not None else "*",
                *(str(b[f] or "-") for f in ("tokens_per_day", "tokens_per_month", "max_parallel")),
                expires,
            )
        )
    table(rows)
    return 0


def audit(http: httpx.Client, args: argparse.Namespace, call: Call) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.since is not None:
        params["since"] = args.since
    data = call(http, "GET", "/admin/audit", params=params)["data"]
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [("WHEN", "WHO", "ACTION", "TARGET", "STATUS", "OUTCOME")]
    rows += [
        (_when(e["at"]), e["actor"], e["action"], e["target"], str(e["status"]), e["outcome"]) for e in data
    ]
    table(rows)
    return 0


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
