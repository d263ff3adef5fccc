"""`raygate deploy | scale | undeploy | load-adapter | unload-adapter | list` (client/deployments.py),
`chat` (client/chat.py), `usage | keys | audit` (client/ledger_commands.py) and `batch`
(client/batches.py): clients of a running gateway's HTTP API, registered and dispatched here.

They speak only HTTP (the `/admin` API and `/v1/chat/completions`), so they work from any machine
that can reach the gateway: `--url` or RAYGATE_URL. Operations that take time (loading a model)
poll the deployment and print progress until it settles.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

from raygate.client import deployments, ledger_commands
from raygate.client.batches import add_batch_commands, run_batch
from raygate.client.chat import add_chat_command, run_chat
from raygate.client.http import ClientError, add_url_option, checked_json


def add_client_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_url_option(common)
    common.add_argument(
        "--admin-key",
        default=os.environ.get("RAYGATE_ADMIN_KEY") or None,
        help="the gateway's admin key, if it has one (env RAYGATE_ADMIN_KEY)",
    )

    ledger_commands.add_ledger_commands(sub, common)
    deployments.add_deployment_commands(sub, common)
    add_batch_commands(sub)
    add_chat_command(sub, common)


def run_client(args: argparse.Namespace) -> int:
    if args.command == "batch":
        return run_batch(args)
    commands = {**deployments.handlers(), "chat": run_chat}
    for name in ("usage", "keys", "audit"):
        commands[name] = _ledger(getattr(ledger_commands, name))
    headers = {"Authorization": f"Bearer {args.admin_key}"} if args.admin_key else {}
    try:
        with httpx.Client(
            base_url=args.url.rstrip("/"), headers=headers, timeout=httpx.Timeout(30.0)
        ) as http:
            return commands[args.command](http, args)
    except ClientError as exc:
        print(f"raygate: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"raygate: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1


def _ledger(command: Any) -> Any:
    return lambda http, args: command(http, args, checked_json)
