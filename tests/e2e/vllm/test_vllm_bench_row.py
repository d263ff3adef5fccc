"""The `make bench` row that sets the vLLM engine behind Raygate against `vllm serve`
(bench/vllm_serve.py): the `vllm serve` command it derives from a config must give vLLM's own
server the engine settings Raygate's replica builds for that model, read by vLLM's own parser, so
the two targets cannot drift apart. No server starts here (the row itself is `python -m bench
--only vllm`; its bench client is tests/e2e/test_vllm_bench.py's); only vLLM's argument parsing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from bench import servers, vllm_bench, vllm_serve
from raygate.backends.engines.model_files import resolve_model_file
from raygate.backends.engines.vllm.engine_args import engine_kwargs
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


# vLLM's own parser and `AsyncEngineArgs`, in a process of their own as `vllm serve` runs them (an
# import of vLLM warns, which this suite turns into errors, and holds ~700 MB): for each case, the
# fields the server's command line gives, and those the replica's keywords give.
READ = """
import json, sys
from vllm import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for case in json.loads(sys.stdin.read()):
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(case["argv"])
    served = AsyncEngineArgs.from_cli_args(parsed)
    replica = AsyncEngineArgs(**case["replica"])
    keys = [*case["keys"], "override_generation_config"]
    out.append({
        "served": {k: getattr(served, k) for k in keys},
        "replica": {k: getattr(replica, k) for k in case["keys"]},
        "names": parsed.served_model_name,
    })
print(json.dumps(out))
"""


def test_vllm_serve_runs_the_engine_settings_of_raygates_replica(tmp_path: Path) -> None:
    models = [vllm_serve.chat_model(config) for config in (VLLM_CONFIG, other_config(tmp_path))]
    cases = []
    for model in models:
        assert model.source is not None
        argv, env = vllm_serve.vllm_serve_command(model)
        assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        assert env == model.env  # the replica's `env:`: KV cache space, OpenMP threads and binding
        # `--peer-drop-env`: the peer at vLLM's default for a key the example tunes, the rest kept.
        _, peer = vllm_serve.vllm_serve_command(model, ("VLLM_ENABLE_V1_MULTIPROCESSING",))
        assert peer == {k: v for k, v in model.env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        folder = str(resolve_model_file(model.source, folder=True))
        cases.append(
            {
                "argv": ["8000" if a == servers.PORT else a for a in argv[3:]],
                "replica": engine_kwargs(folder, embedding=False, user_kwargs=model.engine, num_gpus=0),
                "keys": [*model.engine, "disable_log_stats", "model", "tokenizer"],
            }
        )
    read = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", READ],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    results = json.loads(read.stdout.strip().splitlines()[-1])
    for model, got in zip(models, results, strict=True):
        served = got["served"]
        assert {k: served[k] for k in got["replica"]} == got["replica"]
        assert got["names"] == [model.name, *model.aliases]
        assert served["override_generation_config"] == model.defaults.model_dump(exclude_none=True)
    example, other = (r["served"] for r in results)
    # The example's CPU settings, as a vLLM user would give them; the other's, a false switch.
    assert example["enforce_eager"] is True and example["max_model_len"] == 2048
    assert example["override_generation_config"] == {"repetition_penalty": 1.1}
    assert other["enforce_eager"] is False and other["max_num_seqs"] == 4
    assert other["override_generation_config"] == {}


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
        {"round": 1, "workload": "random", "concurrency": 1, "target": t, "failed": 0, "completed": 16, **m}
        for t, m in (
            (vllm_serve.VLLM_SERVE, {"output_throughput": 40.0, "median_ttft_ms": 100.0, "p99_itl_ms": 50.0}),
            (vllm_serve.RAYGATE, {"output_throughput": 38.0, "median_ttft_ms": 110.0, "p99_itl_ms": 60.0}),
        )
    ]
    for run in runs:
        run["p90_itl_ms"] = run["p99_itl_ms"]
        run["total_output_tokens"] = 16 * vllm_bench.OUTPUT_TOKENS  # every request's tokens counted
    table = vllm_serve.markdown(runs)
    assert "| random | 1 | raygate | 38.0 (38.0\u201338.0)" in table  # median (min-max)
    assert "0.95\u00d7, 1.10\u00d7, 1.20\u00d7" in table  # the ratios to vllm-serve
