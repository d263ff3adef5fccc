"""Releasing what a test gateway's Ray namespace holds once its tests are done.

A gateway attached to a cluster leaves its models serving when it stops: the replicas belong to
the namespace's detached controller, so a restarted gateway finds them again (issue 4). A test
gateway's models would otherwise ride along the rest of the session: the vLLM gateway's two
EngineCores kept ~2 GiB and part of a core busy after their block in a shuffled run, and its
`smollm2-135m-instruct` replica showed up beside the default gateway's replicas of that name."""

from __future__ import annotations

import time

import httpx
import ray

from tests.support.admin import deployments
from tests.support.gateway import GatewayProcess


def stop_and_release(
    gateway: GatewayProcess, namespace: str, headers: dict[str, str] | None = None, timeout: float = 60
) -> int | None:
    """Remove every deployment through the admin API (a drain: engines shut down as in
    production), stop the gateway, then release its namespace; the gateway's exit code."""
    for name in deployments(gateway.url, headers):
        gone = httpx.delete(
            f"{gateway.url}/admin/deployments/{name}", params={"timeout": 60}, headers=headers, timeout=300
        )
        assert gone.status_code == 200, gone.text
    code = gateway.stop(timeout=timeout)
    release_namespace(namespace)
    return code


def release_namespace(namespace: str, timeout: float = 120) -> None:
    """Kill every named actor left in `namespace` (its detached controller and whatever it still
    owns) and wait until Ray lists none."""
    deadline = time.monotonic() + timeout
    while left := [
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace
    ]:
        assert time.monotonic() < deadline, f"still alive in {namespace} after {timeout} s: {left}"
        for name in left:
            try:
                ray.kill(ray.get_actor(name, namespace=namespace))
            except ValueError:  # gone between the listing and the look-up: released already
                continue
            except AssertionError:
                # Ray lists a named actor before its class reaches the GCS (one that a stopping
                # gateway was still creating): no handle can be made yet, so look again next round.
                continue
        time.sleep(0.5)
