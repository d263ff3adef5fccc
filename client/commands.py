"""`raygate deploy | scale | undeploy | list | chat` (and `usage | keys | audit`,
client/ledger_commands.py; `batch`, client/batches.py): clients of a running gateway's HTTP API.

They speak only HTTP (the `/admin` API and `/v1/chat/completions`), so they work from any machine
that can reach the gateway: `--url` or RAYGATE_URL. Operations that take time (loading a model)
poll the deployment and print progress until it settles.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from raygate.client import ledger_commands
from raygate.client.batches import add_batch_commands, run_batch
from raygate.client.http import ClientError, add_url_option, checked
from raygate.protocol.model_source import hub_reference

POLL_SECONDS = 0.5


def add_client_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_url_option(common)
    common.add_argument(
        "--admin-key",
        default=os.environ.get("RAYGATE_ADMIN_KEY") or None,
        help="the gateway's admin key, if it has one (env RAYGATE_ADMIN_KEY)",
    )
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--no-wait", action="store_true", help="return once the change is accepted")
    waiting.add_argument(
        "--timeout", type=float, default=900.0, help="seconds to wait (default: %(default)s)"
    )

    ledger_commands.add_ledger_commands(sub, common)
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

    add_batch_commands(sub)

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


def run_client(args: argparse.Namespace) -> int:
    if args.command == "batch":
        return run_batch(args)
    commands = {
        "deploy": _deploy,
        "scale": _scale,
        "undeploy": _undeploy,
        "load-adapter": _load_adapter,
        "unload-adapter": _unload_adapter,
        "list": _list,
        "chat": _chat,
    }
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
    return lambda http, args: command(http, args, _call)


def _call(http: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    return checked(http, method, path, **kw).json()


def key_values(items: list[str], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ClientError(f"{what} wants KEY=VALUE, got `{item}`")
        out[key] = yaml.safe_load(value)  # n_ctx=2048 -> int, flash_attn=true -> bool
    return out


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if args.spec is not None:
        loaded = yaml.safe_load(args.spec.read_text())
        if not isinstance(loaded, dict):
            raise ClientError(f"{args.spec} must hold one model entry (a mapping)")
        spec = loaded
        source = spec.get("source")
        if isinstance(source, dict) and isinstance(source.get("path"), str):
            source["path"] = str((args.spec.parent / source["path"]).resolve())
    if args.path:
        spec["source"] = {"path": str(Path(args.path).expanduser().resolve())}
    elif args.hf or args.modelscope:
        spec["source"] = hub_source("hf" if args.hf else "modelscope", args.hf or args.modelscope, args.file)
        if args.revision:
            spec["source"]["revision"] = args.revision
    elif args.package or args.file:
        spec["source"] = {"package": args.package, "file": args.file}
    options = {
        "name": args.name,
        "aliases": args.alias,
        "backend": args.backend,
        "task": args.task,
        "replicas": args.replicas,
        "num_cpus": args.num_cpus,
        "num_gpus": args.num_gpus,
        "max_restarts": args.max_restarts,
    }
    spec.update({k: v for k, v in options.items() if v is not None})
    if args.resource:
        spec["resources"] = {k: float(v) for k, v in key_values(args.resource, "--resource").items()}
    if args.engine:
        spec["engine"] = {**spec.get("engine", {}), **key_values(args.engine, "--engine")}
    if args.vision:
        spec.setdefault("vision", {})
    if not spec.get("name"):
        raise ClientError("give the model a name (NAME, or `name:` in --spec)")
    return spec


def hub_source(hub: str, repo: str, file: str | None) -> dict[str, Any]:
    """`ORG/REPO:QUANT` as a source: the quantisation names the GGUF (`*QUANT*.gguf`), as in
    llama-server's `-hf`; an explicit `--file` glob wins."""
    repo, glob = hub_reference(repo)
    source: dict[str, Any] = {hub: repo}
    if file or glob:
        source["file"] = file or glob
    return source


def _deploy(http: httpx.Client, args: argparse.Namespace) -> int:
    spec = _spec(args)
    t0 = time.monotonic()
    status = _call(http, "POST", "/admin/deployments", json=spec)
    print(f"deploying {status['name']} ({status['desired']} replica(s))", file=sys.stderr)
    return _settle(http, status, args, t0, "deployed")


def _scale(http: httpx.Client, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    body = {"replicas": args.replicas, "drain_timeout": args.drain_timeout}
    status = _call(http, "PATCH", f"/admin/deployments/{args.name}", json=body)
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
        status = _call(http, "GET", f"/admin/deployments/{name}")
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
    result = _call(
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
    status = _call(http, "POST", "/admin/adapters", json=body, timeout=300)
    print(f"loaded adapter {args.name} on {status['name']}")
    return 0


def _unload_adapter(http: httpx.Client, args: argparse.Namespace) -> int:
    status = _call(http, "DELETE", f"/admin/adapters/{args.name}", timeout=300)
    print(f"unloaded adapter {args.name} from {status['name']}")
    return 0


def _list(http: httpx.Client, args: argparse.Namespace) -> int:
    deployments = _call(http, "GET", "/admin/deployments")["data"]
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


def _chat(http: httpx.Client, args: argparse.Namespace) -> int:
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
