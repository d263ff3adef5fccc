"""The `make bench` row that sets the vLLM engine behind Raygate against `vllm serve`
(bench/vllm_serve.py): the `vllm serve` command it derives from a config must give vLLM's own
server the engine settings Raygate's replica builds for that model, read by vLLM's own parser, so
the two targets cannot drift apart. No server starts here (the row itself is `python -m bench
--only vllm`; its bench client is tests/e2e/test_vllm_bench.py's); only vLLM's argument parsing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench import servers, vllm_bench, vllm_serve
from raygate.backends.engines.model_files import resolve_model_file
from raygate.backends.engines.vllm.support import engine_kwargs
from tests.support.vllm import VLLM_CONFIG

# Settings the example does not use: a false switch, another integer, and no sampling defaults.
OTHER_ENGINE = {"enforce_eager": False, "max_model_len": 1024, "max_num_seqs": 4}


def other_config(tmp_path: Path) -> Path:
    raw = yaml.safe_load(VLLM_CONFIG.read_text())
    chat = raw["models"][0]
    chat["engine"], chat["env"] = dict(OTHER_ENGINE), {"VLLM_CPU_KVCACHE_SPACE": "2"}
    chat.pop("defaults", None)
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump({"models": [chat]}))
    return path


@pytest.mark.parametrize("which", ["example", "other"])
def test_vllm_serve_runs_the_engine_settings_of_raygates_replica(which: str, tmp_path: Path) -> None:
    from vllm import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    config = VLLM_CONFIG if which == "example" else other_config(tmp_path)
    model = vllm_serve.chat_model(config)
    assert model.source is not None
    argv, env = vllm_serve.vllm_serve_command(model)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["8000" if a == servers.PORT else a for a in argv[3:]]
    )
    served = AsyncEngineArgs.from_cli_args(parsed)
    folder = str(resolve_model_file(model.source, folder=True))
    replica = AsyncEngineArgs(**engine_kwargs(folder, embedding=False, user_kwargs=model.engine, num_gpus=0))
    for key in (*model.engine, "disable_log_stats", "model", "tokenizer"):
        assert getattr(served, key) == getattr(replica, key), key
    assert parsed.served_model_name == [model.name, *model.aliases]
    assert served.override_generation_config == model.defaults.model_dump(exclude_none=True)
    assert env == model.env
    if which == "example":  # the example's CPU settings, as a vLLM user would set them
        assert served.enforce_eager and served.max_model_len == 2048
        assert served.override_generation_config == {"repetition_penalty": 1.1}
        assert env["VLLM_CPU_KVCACHE_SPACE"] and env["OMP_NUM_THREADS"]
    else:
        assert served.enforce_eager is False and served.max_num_seqs == 4


def test_the_row_benches_the_config_model_with_its_own_tokenizer() -> None:
    """The cells the row sends: the chat model by its served name, its folder as tokenizer, every
    workload of the issue, and the table's peer (ratios) is `vllm serve`."""
    model = vllm_serve.chat_model()
    assert model.name == yaml.safe_load(VLLM_CONFIG.read_text())["models"][0]["name"]
    assert set(vllm_serve.WORKLOADS) == set(vllm_bench.WORKLOADS)
    assert vllm_serve.TARGETS[0] == vllm_serve.VLLM_SERVE
    argv = vllm_serve.raygate_command(vllm_serve.CONFIG)
    assert argv[1:] == ["serve", "--config", str(VLLM_CONFIG), "--port", servers.PORT]
    runs = [
        {"round": 1, "workload": "random", "concurrency": 1, "target": t, "failed": 0, **m}
        for t, m in (
            (vllm_serve.VLLM_SERVE, {"output_throughput": 40.0, "median_ttft_ms": 100.0, "p99_itl_ms": 50.0}),
            (vllm_serve.RAYGATE, {"output_throughput": 38.0, "median_ttft_ms": 110.0, "p99_itl_ms": 60.0}),
        )
    ]
    for run in runs:
        run["p90_itl_ms"] = run["p99_itl_ms"]
    table = vllm_serve.markdown(runs)
    assert "| random | 1 | raygate | 38.0 (38.0\u201338.0)" in table  # median (min-max)
    assert "0.95\u00d7, 1.10\u00d7, 1.20\u00d7" in table  # the ratios to vllm-serve
