"""Build, once per machine, the two LoRA adapters that `examples/lora.yaml` serves on SmolLM2.

Nobody publishes a LoRA for the 135M SmolLM2 we ship, so this script makes two with `peft` on the
bf16 Hugging Face folder `models/build_vllm_models.py` dequantises from the shipped GGUF: rank-8
adapters on every attention and MLP projection with random, seeded, non-zero weights (`peft`
starts `lora_B` at zero, which would change nothing), strong enough that the greedy answer moves
but the model still writes tokens. Each adapter is saved twice under `~/.cache/raygate/models/`:

    smollm2-lora-a-v1/                    the PEFT folder (adapter_config.json + safetensors): vLLM
    smollm2-lora-a-v1/smollm2-lora-a.gguf the same weights in GGUF: llama.cpp

The GGUF comes from llama.cpp's own `convert_lora_to_gguf.py` out of the pinned llama-cpp-python
sdist (with the `gguf-py` and `conversion` package beside it in that tarball), so the file matches
what the pinned llama.cpp reads. Folders are named after this script's format version: a changed
recipe gets new folders, an unchanged one is never rebuilt.

One more adapter, `other-base-lora`, is made the same way for ANOTHER base: a tiny random Llama
(2 layers, hidden size 64, SmolLM2's tokenizer) saved under `tiny-llama-other-base-v1/`, so the
tests can check that an adapter of another base is refused by name (issue 49). It has its own
version (OTHER_VERSION): adding it rebuilt none of the SmolLM2 adapters.

    python models/build_lora_adapters.py           # build what is missing, print the GGUF paths
    python models/build_lora_adapters.py --check   # also: greedy answers of base, a and b
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

# Same folder as build_vllm_models.py: the adapters are built on its output.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_vllm_models import CACHE, build_smollm2, smollm2_folder

FORMAT_VERSION = 1  # bump when the output of `build_adapter` changes
ADAPTERS = {"smollm2-lora-a": 1234, "smollm2-lora-b": 5678}  # name -> seed
SDIST = Path("~/.cache/raygate/sdist/llama_cpp_python-0.3.36.tar.gz").expanduser()
CONVERTER = Path("~/.cache/raygate/src/llama-cpp-convert-0.3.36").expanduser()
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK = 8
B_STD = 0.5  # std of lora_B: 0.2 leaves confident answers alone, 1.0 writes gibberish (--check)
# The adapter of another base model, and that base: its own versions, so the SmolLM2 ones stay.
OTHER, OTHER_SEED, OTHER_VERSION = "other-base-lora", 4321, 1
OTHER_BASE = CACHE / f"tiny-llama-other-base-v{OTHER_VERSION}"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


def adapter_folder(name: str) -> Path:
    return CACHE / f"{name}-v{OTHER_VERSION if name == OTHER else FORMAT_VERSION}"


def adapter_gguf(name: str) -> Path:
    return adapter_folder(name) / f"{name}.gguf"


def converter() -> Path:
    """llama.cpp's converter, its `gguf-py` and `conversion` package, extracted from the sdist once."""
    script = CONVERTER / "convert_lora_to_gguf.py"
    if script.is_file():
        return script
    if not SDIST.is_file():
        raise SystemExit(f"{SDIST} is missing (run `make setup`, which downloads the pinned sdist)")
    prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
    wanted = ("convert_lora_to_gguf.py", "convert_hf_to_gguf.py", "gguf-py/", "conversion/")
    CONVERTER.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CONVERTER.parent, prefix=f".{CONVERTER.name}.") as tmp:
        with tarfile.open(SDIST) as tar:
            for member in tar.getmembers():
                rest = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and rest.startswith(wanted) and member.isfile():
                    member.name = rest
                    tar.extract(member, tmp, filter="data")
        shutil.rmtree(CONVERTER, ignore_errors=True)
        Path(tmp).rename(CONVERTER)
    return script


def build_other_base(smollm2: Path) -> None:
    """A tiny random Llama that is not SmolLM2 (hidden size 64, 2 layers) with SmolLM2's vocabulary
    and tokenizer, so that llama.cpp's converter reads it as a base: seconds to build."""
    import torch
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(OTHER_SEED)
    vocab = AutoConfig.from_pretrained(smollm2).vocab_size
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    OTHER_BASE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OTHER_BASE.parent, prefix=f".{OTHER_BASE.name}.") as tmp:
        LlamaForCausalLM(config).save_pretrained(tmp)
        for file in TOKENIZER_FILES:
            if (smollm2 / file).is_file():
                shutil.copy(smollm2 / file, tmp)
        shutil.rmtree(OTHER_BASE, ignore_errors=True)
        Path(tmp).rename(OTHER_BASE)


def build_adapter(name: str, seed: int, base: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    t0 = time.monotonic()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=RANK, target_modules=TARGETS, lora_dropout=0.0)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for param_name, param in peft_model.named_parameters():
            if "lora_B" in param_name:
                param.normal_(0.0, B_STD)
    out = adapter_folder(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        peft_model.save_pretrained(tmp)
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        subprocess.run(
            [
                *(sys.executable, str(converter()), "--base", str(base), "--outtype", "f32"),
                *("--outfile", str(Path(tmp, f"{name}.gguf")), tmp),
            ],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        Path(tmp, "SOURCE.txt").write_text(
            f"Random rank-{RANK} LoRA (seed {seed}, lora_B ~ N(0, {B_STD})) on {base.name}, "
            "by models/build_lora_adapters.py; the GGUF by llama.cpp's convert_lora_to_gguf.py.\n"
        )
        shutil.rmtree(out, ignore_errors=True)
        Path(tmp).rename(out)
    print(f"built {out} in {time.monotonic() - t0:.0f}s", file=sys.stderr)


def check(base: Path) -> None:
    """Greedy answers with transformers + peft: each adapter's must differ from the base's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    messages = [{"role": "user", "content": "Tell me a short story about a cat."}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    model = AutoModelForCausalLM.from_pretrained(base)
    out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    print("base:", repr(tokenizer.decode(out[0][ids["input_ids"].shape[1] :])), file=sys.stderr)
    for name in ADAPTERS:
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter_folder(name))
        out = tuned.generate(**ids, max_new_tokens=16, do_sample=False)
        print(f"{name}:", repr(tokenizer.decode(out[0][ids["input_ids"].shape[1] :])), file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="greedy-decode a prompt with transformers")
    parser.add_argument("--force", action="store_true", help="rebuild even if the folders exist")
    args = parser.parse_args()
    base = smollm2_folder()
    if not (base / "config.json").is_file():
        build_smollm2(base)
    for name, seed in ADAPTERS.items():
        if args.force or not adapter_gguf(name).is_file():
            build_adapter(name, seed, base)
    if args.force or not (OTHER_BASE / "config.json").is_file():
        build_other_base(base)
    if args.force or not adapter_gguf(OTHER).is_file():
        build_adapter(OTHER, OTHER_SEED, OTHER_BASE)
    if args.check:
        check(base)
    for name in [*ADAPTERS, OTHER]:
        print(f"{name}: {adapter_gguf(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
