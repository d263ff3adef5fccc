"""The `raygate` entry point: help text, config errors, and a gateway that starts its own Ray."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import openai

from bench.servers import replica_pids
from tests.support.gateway import RAYGATE, REPO, start_gateway


def test_help_explains_every_option() -> None:
    out = subprocess.run([str(RAYGATE), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    for option in ("--config", "--host", "--port", "--ray-address", "RAYGATE_PORT", "RAY_ADDRESS"):
        assert option in out


def test_bad_config_fails_fast(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: x\n    sorce: {path: y.gguf}\n")
    r = subprocess.run(
        [str(RAYGATE), "serve", "--config", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "sorce" in r.stderr


def test_misspelt_engine_option_fails_fast_naming_it(tmp_path: Path) -> None:
    # llama_cpp.Llama ignores unknown keyword arguments: without the check this config would serve
    # the default context and say nothing.
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(
        f"models:\n  - name: x\n    source: {{path: {REPO / 'models/all-minilm-l6-v2.Q8_0.gguf'}}}\n"
        "    task: embed\n    engine: {n_ctxx: 4096}\n"
    )
    r = subprocess.run(
        [str(RAYGATE), "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "model `x`" in r.stderr and "`n_ctxx` (did you mean `n_ctx`?)" in r.stderr


def test_missing_model_file_fails_with_reason(tmp_path: Path) -> None:
    cfg = tmp_path / "missing.yaml"
    cfg.write_text("models:\n  - name: x\n    source: {path: /nonexistent/model.gguf}\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    r = subprocess.run(
        [str(RAYGATE), "serve", "--config", str(cfg), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert r.returncode != 0
    assert "Model file not found: /nonexistent/model.gguf" in r.stdout + r.stderr


def test_embedded_ray_serves_and_exits_cleanly(tmp_path: Path) -> None:
    """No --ray-address: the gateway starts (and stops) a private single-node Ray, as `make serve` does."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    gw = start_gateway(
        ["--config", str(REPO / "tests" / "configs" / "embed-only.yaml")], tmp_path / "gw.log", env=env
    )
    try:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as client:
            assert [m.id for m in client.models.list()] == ["minilm"]
            assert len(client.embeddings.create(model="minilm", input="hi").data[0].embedding) == 384
            # Replicas run at normal priority, not at Ray's default worker nice 15 (see ray_cluster).
            replicas = replica_pids(gw.proc.pid)
            assert replicas and all(os.getpriority(os.PRIO_PROCESS, p) == 0 for p in replicas)
    finally:
        code = gw.stop()
    assert code == 0, gw.log()[-3000:]
