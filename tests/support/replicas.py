"""The replica actors of a model on the session's Ray cluster, found by name, and their engines'
stats: what the end-to-end tests observe behind the gateway. Needs a connected Ray (the
`ray_address` fixture of tests/e2e/conftest.py)."""

from __future__ import annotations

from typing import Any

import ray


def replica_actors(model: str) -> list[Any]:
    named = sorted(
        (a["name"], a["namespace"])
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"raygate:{model}:")
    )
    return [ray.get_actor(name, namespace=namespace) for name, namespace in named]


def replica_stats(model: str) -> list[Any]:
    return ray.get([a.stats.remote() for a in replica_actors(model)])
