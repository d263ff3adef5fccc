"""The benchmark's metric arithmetic (bench/metrics.py), the configs it serves, and the ports its
servers take. Its load client against real servers: tests/e2e/test_bench_client.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import servers
from bench.metrics import RequestResult, percentile, summarize
from bench.report import slope_per_1000


def test_percentile_matches_numpy() -> None:
    values = [0.3, 0.1, 0.9, 0.5, 0.7, 0.2, 0.25]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([4.0], 99) == 4.0


def test_summary_follows_vllm_definitions() -> None:
    # Request 1: sent at 0, text chunks at 0.1, 0.2, 0.4, end 0.5, 5 tokens (several per chunk).
    a = RequestResult(
        sent=0.0,
        ok=True,
        status="200",
        first_token=0.1,
        chunk_times=[0.1, 0.2, 0.4],
        end=0.5,
        output_tokens=5,
    )
    # Request 2: sent at 0.5, one chunk at 0.8, end 1.0, 1 token: no TPOT, no ITL.
    b = RequestResult(
        sent=0.5, ok=True, status="200", first_token=0.8, chunk_times=[0.8], end=1.0, output_tokens=1
    )
    failed = RequestResult(sent=0.2, status="503")
    s = summarize([a, b, failed])
    assert (s.requests, s.completed, s.failures) == (3, 2, {"503": 1})
    assert s.duration_s == pytest.approx(1.0)
    assert s.output_tokens == 6
    assert s.output_throughput == pytest.approx(6.0)
    assert s.request_throughput == pytest.approx(2.0)
    assert s.ttft_ms["mean"] == pytest.approx(200.0)
    assert s.tpot_ms["p50"] == pytest.approx((0.5 - 0.1) / 4 * 1000)
    assert sorted([round(x, 6) for x in a.itls]) == [0.1, 0.2]
    assert s.itl_ms["p50"] == pytest.approx(150.0)
    assert s.e2e_ms["p50"] == pytest.approx(500.0)
    assert summarize([a], duration_s=2.0).output_throughput == pytest.approx(2.5)


def test_memory_slope() -> None:
    assert slope_per_1000([(0, 100.0), (1000, 101.0), (2000, 102.0)]) == pytest.approx(1.0)
    assert slope_per_1000([(0, 100.0), (1000, 100.0)]) == pytest.approx(0.0)


def test_the_serve_target_runs_make_serves_models(tmp_path: Path) -> None:
    """What `make bench` compares with llama-server: models/default.yaml itself (every model of it,
    the embedding one found from anywhere)."""
    from bench.run import _serve_config
    from raygate.server.config_file import load_config
    from raygate.server.settings import DEFAULT_CONFIG

    config = load_config(_serve_config(tmp_path))
    default = load_config(DEFAULT_CONFIG)
    embed = next(m for m in config.models if m.task == "embed")
    assert embed.source is not None and embed.source.path is not None
    assert Path(embed.source.path).is_file()
    same = [m.model_copy(update={"source": embed.source}) if m.task == "embed" else m for m in default.models]
    assert config.models == same  # the same specs; only the embedding file's path is absolute


@pytest.mark.parametrize("target", ["serve", "serve-fa-off", "serve-all-threads", "serve-2x1"])
def test_the_other_shapes_change_only_the_chat_models_fields_they_name(target: str) -> None:
    """The shapes the `serve` gateway's chat model is updated to between runs: valid specs, equal to
    make serve's chat model but for the fields plan.SOLO_TARGETS names."""
    from bench import plan
    from bench.run import variant_spec
    from raygate.protocol.config import ModelConfig
    from raygate.server.config_file import load_config
    from raygate.server.settings import DEFAULT_CONFIG

    spec = ModelConfig.model_validate(variant_spec(target))
    chat = next(m for m in load_config(DEFAULT_CONFIG).models if m.name == plan.LLAMA_MODEL)
    changes = plan.SOLO_TARGETS[target]
    for key, value in changes.items():
        assert getattr(spec, key) == ({**chat.engine, **value} if key == "engine" else value)
    assert spec.model_copy(update={k: getattr(chat, k) for k in changes}) == chat


def test_a_picked_port_is_free_and_below_the_ephemeral_range() -> None:
    """What the tests' gateways and the benchmark's servers bind: never a port that a port-0
    bind elsewhere could take before the server binds it."""
    import socket

    low = int(servers.EPHEMERAL_RANGE.read_text().split()[0])
    ports = {servers.free_port() for _ in range(20)}
    for port in ports:
        if low > servers.FIRST_PICKED_PORT:
            assert servers.FIRST_PICKED_PORT <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert len(ports) > 1  # picked at random, so servers started together do not meet
