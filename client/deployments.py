"""`raygate deploy | scale | undeploy | load-adapter | unload-adapter | list`: the models of a
running gateway, managed through its `/admin/deployments` and `/admin/adapters` API.

Its own module because these commands share one job, changing or showing what the gateway serves,
and one way of reporting it: a change that takes time (loading a model, draining a replica) is
polled until it settles, its progress (and a Hub download's bar) printed on the way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from raygate.client.deploy_spec import model_spec
from raygate.client.http import ClientError, checked_json

POLL_SECONDS = 0.5


def add_deployment_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--no-wait", action="store_true", help="return once the change is accepted")
    waiting.add_argument(
        "--timeout", type=float, default=900.0, help="seconds to wait (default: %(default)s)"
    )

    deploy = sub.add_parser(
        "deploy",
        parents=[common, waiting],
        help="deploy a model on a running gateway",
        description="Deploy a model: give its weights (--path, --package/--file, or a Hub repository: "
        "--hf ORG/REPO[:QUANT] / --modelscope ORG/REPO[:QUANT]) or a YAML spec with the keys of a "
        "models.yaml entry (--spec). Waits until its replicas are ready, showing a Hub download's progress.",
    )
    deploy.add_argument("name", nargs="?", help="model id clients will send (overrides the spec's name)")
    deploy.add_argument("--spec", type=Path, help="YAML file holding one model entry")
    deploy.add_argument("--path", help="GGUF file (made absolute here; must exist on the nodes that load it)")
    deploy.add_argument("--package", help="installed Python package that ships the weights")
    deploy.add_argument(
        "--file", help="file inside --package; with --hf / --modelscope, a glob picking one GGUF"
    )
    deploy.add_argument(
        "--hf",
        metavar="ORG/REPO[:QUANT]",
        help="Hugging Face Hub repository; `:Q4_K_M` picks that GGUF (llama-server's -hf form); "
        "without it, the repository's one GGUF, or the whole repository for --backend vllm",
    )
    deploy.add_argument("--modelscope", metavar="ORG/REPO[:QUANT]", help="ModelScope repository, as --hf")
    deploy.add_argument("--revision", help="branch, tag or commit of --hf / --modelscope (pinned at deploy)")
    deploy.add_argument(
        "--vision",
        action="store_true",
        help="a vision model (`vision: {}`); from --hf / --modelscope, with the repository's mmproj GGUF",
    )
    deploy.add_argument("--alias", action="append", default=None, help="another id (repeatable)")
    deploy.add_argument("--backend", help="engine (default llama_cpp)")
    deploy.add_argument("--task", choices=["generate", "embed"])
    deploy.add_argument("--replicas", type=int)
    deploy.add_argument("--num-cpus", type=float, help="Ray CPUs per replica")
    deploy.add_argument("--num-gpus", type=float, help="Ray GPUs per replica")
    deploy.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="custom Ray resource per replica (repeatable)",
    )
    deploy.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine keyword argument, e.g. n_ctx=2048 (repeatable)",
    )
    deploy.add_argument("--max-restarts", type=int)

    scale = sub.add_parser("scale", parents=[common, waiting], help="change a model's replica count")
    scale.add_argument("name")
    scale.add_argument("replicas", type=int)
    scale.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds a removed replica may finish its requests (default: %(default)s)",
    )

    undeploy = sub.add_parser("undeploy", parents=[common], help="drain and remove a model")
    undeploy.add_argument("name")
    undeploy.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests may take to finish (default: %(default)s)",
    )

    load = sub.add_parser("load-adapter", parents=[common], help="load a LoRA adapter on a model")
    load.add_argument("name", help="the adapter's name: what clients then send as `model`")
    load.add_argument("path", help="its GGUF LoRA file on the replicas' nodes (absolute or ~/...)")
    load.add_argument("--model", help="the base model (name or alias); needed when several can take it")
    load.add_argument(
        "--scale", type=float, default=1.0, help="how strongly it applies (default: %(default)s)"
    )
    unload = sub.add_parser("unload-adapter", parents=[common], help="unload a LoRA adapter")
    unload.add_argument("name")

    listing = sub.add_parser("list", parents=[common], help="list deployments and their replicas")
    listing.add_argument("--json", action="store_true", help="print the raw JSON")


def handlers() -> dict[str, Callable[[httpx.Client, argparse.Namespace], int]]:
    """Each command of add_deployment_commands and the function that runs it."""
    return {
        "deploy": _deploy,
        "scale": _scale,
        "undeploy": _undeploy,
        "load-adapter": _load_adapter,
        "unload-adapter": _unload_adapter,
        "list": _list,
    }


def _deploy(http: httpx.Client, args: argparse.Namespace) -> int:
    spec = model_spec(args)
    t0 = time.monotonic()
    status = checked_json(http, "POST", "/admin/deployments", json=spec)
    print(f"deploying {status['name']} ({status['desired']} replica(s))", file=sys.stderr)
    return _settle(http, status, args, t0, "deployed")


def _scale(http: httpx.Client, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    body = {"replicas": args.replicas, "drain_timeout": args.drain_timeout}
    status = checked_json(http, "PATCH", f"/admin/deployments/{args.name}", json=body)
    print(f"scaling {args.name} to {args.replicas} replica(s)", file=sys.stderr)
    return _settle(http, status, args, t0, "scaled")


def _settle(
    http: httpx.Client, status: dict[str, Any], args: argparse.Namespace, t0: float, verb: str
) -> int:
    """Poll until nothing is loading or draining, printing each change of the picture."""
    name = status["name"]
    last = ""
    deadline = t0 + args.timeout
    while not args.no_wait:
        line = _progress(status)
        if line != last:
            print(f"  [{time.monotonic() - t0:5.1f}s] {line}", file=sys.stderr, flush=True)
            last = line
        if _settled(status):
            break
        if time.monotonic() > deadline:
            raise ClientError(f"{name} did not settle in {args.timeout:.0f}s: {line}")
        time.sleep(POLL_SECONDS)
        status = checked_json(http, "GET", f"/admin/deployments/{name}")
    if status["state"] in ("failed", "degraded") and not args.no_wait:
        raise ClientError(f"{name} is {status['state']}: {status.get('error')}")
    print(f"{verb} {name}: {status['ready']}/{status['desired']} ready in {time.monotonic() - t0:.1f}s")
    return 0


def _download_bar(download: dict[str, Any] | None) -> str:
    """` [#####-----] 41% 40.1/98.4 MB 12.3 MB/s` while a Hub download runs."""
    if not download or download.get("done"):
        return ""
    done, total = int(download["bytes_done"]), max(1, int(download["bytes_total"]))
    filled = 20 * done // total
    return (
        f" [{'#' * filled}{'-' * (20 - filled)}] {100 * done // total}% "
        f"{done / 1e6:.1f}/{total / 1e6:.1f} MB {float(download['bytes_per_s']) / 1e6:.1f} MB/s"
    )


def _settled(status: dict[str, Any]) -> bool:
    moving = any(r["state"] in ("loading", "draining") for r in status["replicas"])
    return not moving and not status.get("updating")


def _progress(status: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for r in status["replicas"]:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    line = f"{status['state']}: {status['ready']}/{status['desired']} ready ({parts or 'no replica'})"
    return line + _download_bar(status.get("download"))


def _undeploy(http: httpx.Client, args: argparse.Namespace) -> int:
    print(f"undeploying {args.name} (draining up to {args.timeout:.0f}s)", file=sys.stderr, flush=True)
    result = checked_json(
        http,
        "DELETE",
        f"/admin/deployments/{args.name}",
        params={"timeout": args.timeout},
        timeout=args.timeout + 60,
    )
    how = "drained" if result["drained"] else "timed out draining; in-flight requests were cut"
    print(f"undeployed {args.name}: {how} in {result['seconds']:.1f}s")
    return 0


def _load_adapter(http: httpx.Client, args: argparse.Namespace) -> int:
    body = {
        "lora_name": args.name,
        "lora_path": args.path,
        "base_model_name": args.model,
        "scale": args.scale,
    }
    status = checked_json(http, "POST", "/admin/adapters", json=body, timeout=300)
    print(f"loaded adapter {args.name} on {status['name']}")
    return 0


def _unload_adapter(http: httpx.Client, args: argparse.Namespace) -> int:
    status = checked_json(http, "DELETE", f"/admin/adapters/{args.name}", timeout=300)
    print(f"unloaded adapter {args.name} from {status['name']}")
    return 0


def _list(http: httpx.Client, args: argparse.Namespace) -> int:
    deployments = checked_json(http, "GET", "/admin/deployments")["data"]
    if args.json:
        print(json.dumps(deployments, indent=2))
        return 0
    rows = [("NAME", "STATE", "READY", "BACKEND", "ALIASES / REPLICA", "ROUTING", "SCALING", "NODE", "ERROR")]
    for d in deployments:
        spec = d["spec"]
        rows.append(
            (
                d["name"],
                d["state"],
                f"{d['ready']}/{d['desired']}",
                spec["backend"],
                ",".join(spec["aliases"]) or "-",
                d.get("routing", "-"),
                _scaling(d),
                "",
                d.get("error") or "",
            )
        )
        for r in d["replicas"]:
            node = (r.get("node_id") or "-")[:12]
            bar = _download_bar(r.get("download")).strip()
            rows.append(("", f"  {r['state']}", "", "", r["id"], "", "", node, r.get("error") or bar))
        for e in d.get("scaling_events", [])[-3:]:
            when = time.strftime("%H:%M:%S", time.localtime(e["at"]))
            change = f"{e['from_replicas']} -> {e['to_replicas']}"
            rows.append(("", "  scaled", change, "", when, "", "", "", e["reason"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print(
            (
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1][:120]
            ).rstrip()
        )
    return 0


def _scaling(d: dict[str, Any]) -> str:
    """`fixed`, or the autoscaling range and the load the controller last saw."""
    auto = d["spec"].get("autoscaling")
    if not auto:
        return "fixed"
    return f"auto:{auto['min_replicas']}-{auto['max_replicas']},ongoing={d.get('ongoing', 0):g}"
