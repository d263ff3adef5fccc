"""`raygate deploy`'s flags as one model entry (the keys of a models.yaml entry), the body the
gateway's `POST /admin/deployments` takes.

Its own module because it is pure translation, no HTTP: the tests check it against ModelConfig,
and the benchmarks read `--engine`-style KEY=VALUE options through the same parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from raygate.client.http import ClientError
from raygate.protocol.model_source import hub_reference


def key_values(items: list[str], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ClientError(f"{what} wants KEY=VALUE, got `{item}`")
        out[key] = yaml.safe_load(value)  # n_ctx=2048 -> int, flash_attn=true -> bool
    return out


def model_spec(args: argparse.Namespace) -> dict[str, Any]:
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
