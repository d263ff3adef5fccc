"""Helpers for the tests against vLLM-served models (tests/e2e/vllm)."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import yaml

from tests.support.gateway import REPO, GatewayProcess

VLLM_CONFIG = REPO / "examples" / "vllm-cpu.yaml"
LORA_VLLM_CONFIG = REPO / "examples" / "lora-vllm.yaml"
# `max_num_seqs` of the session's vLLM chat model (`session_config`).
VLLM_MAX_NUM_SEQS = 8


def session_config(out: Path) -> Path:
    """The config the session's vLLM gateway serves, written to `out`: examples/vllm-cpu.yaml with
    its chat model as examples/lora-vllm.yaml declares it (the same model, LoRA on, adapters A and
    B), so the LoRA suite runs on the same EngineCore as the rest of the folder instead of a third
    one (tests/e2e/vllm/test_vllm_lora.py). The adapters must be built (tests/support/lora.py)."""
    models = yaml.safe_load(VLLM_CONFIG.read_text())["models"]
    lora = {m["name"]: m for m in yaml.safe_load(LORA_VLLM_CONFIG.read_text())["models"]}
    # A bound on the sequences its EngineCore runs at once, so requests past it wait in vLLM's own
    # queue, where its priority scheduling orders them (tests/e2e/vllm/test_vllm_batches.py).
    for model in lora.values():
        model.setdefault("engine", {})["max_num_seqs"] = VLLM_MAX_NUM_SEQS
    out.write_text(yaml.safe_dump({"models": [lora.get(m["name"], m) for m in models]}, sort_keys=False))
    return out


def missing_setup() -> str | None:
    """Why the vLLM tests cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment"
    for model in yaml.safe_load(VLLM_CONFIG.read_text())["models"]:
        path = model["source"].get("path")
        if path and not (Path(path).expanduser() / "config.json").is_file():
            return f"the model folder {path} has not been built"
    return None


# The vLLM gateway runs its own controller (its own Ray namespace): gateways that share a namespace
# share one registry, and this one must serve examples/vllm-cpu.yaml, not the default models.
VLLM_NAMESPACE = "raygate-vllm"
# A test model deployed on vLLM beside the default ones: offline, a small KV cache, one thread, no
# core binding (2 cores shared with the rest of the suite).
CPU_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # as examples/vllm-cpu.yaml: no worker process
}


def actor_names(namespace: str = VLLM_NAMESPACE) -> set[str]:
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and a["name"].startswith("raygate:")
    }


@dataclass
class VllmDeployment:
    """The vLLM gateway and the Ray namespace its controller and replicas live in."""

    process: GatewayProcess
    namespace: str = VLLM_NAMESPACE

    def replica(self, model: str) -> Any:
        """The one replica actor serving `model` in this gateway."""
        names = [
            n for n in actor_names(self.namespace) if re.fullmatch(rf"raygate:{re.escape(model)}:\d+:.+", n)
        ]
        assert len(names) == 1, names
        return ray.get_actor(names[0], namespace=self.namespace)


def replica_pid(actor: Any) -> int:
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid())))
