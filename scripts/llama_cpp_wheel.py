"""Build the llama-cpp-python wheel Raygate installs: the pinned sdist (constraints.txt) with the
llama.cpp patches in scripts/llama_cpp/ applied, compiled with the caller's CMAKE_ARGS.

    python scripts/llama_cpp_wheel.py [--out DIR]     # prints the wheel's path

Why a patched build: llama-cpp-python has no wheel for Linux on PyPI, so pip compiles its sdist
anyway; this compiles the same sources plus the patches (each one says why, and what it
measured): a faster Q8_0 V read in flash attention (the same numbers), one flash-attention
kernel for every batch (a token's numbers then do not depend on how its prompt was cut into
decodes, the prompt cache's guarantee, and prompts evaluate faster), one path for F32 matrix
products at every batch size (the same guarantee under a LoRA adapter), a decode's query heads
that share a K/V head attended together (the same numbers, a little faster with long contexts),
and Q4_1 weights taken four rows at a time against a prompt or a batch (the same numbers, faster).
The wheel's version
carries a local label (`0.3.36+raygate.5`), which the `==0.3.36` pins accept, so `pip list` shows
which build is installed.

The wheel is cached under ~/.cache/raygate/wheels/, keyed by the version, the patches and
CMAKE_ARGS: a later `make setup` (or a new venv) installs it in seconds. Standard library only:
the Dockerfile's builder runs it before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCHES = Path(__file__).resolve().parent / "llama_cpp"
CACHE = Path.home() / ".cache" / "raygate"
# Bumped when the set of patches changes meaning; the cache key covers their bytes anyway.
LOCAL_LABEL = "raygate.5"


def pinned_version(constraints: Path = ROOT / "constraints.txt") -> str:
    """llama-cpp-python's version as constraints.txt pins it (the one source of the pin)."""
    found = re.search(r"^llama-cpp-python==([^\s+]+)", constraints.read_text(), re.MULTILINE)
    if not found:
        sys.exit(f"{constraints} pins no llama-cpp-python version")
    return found.group(1)


def index_version(installed: str) -> str:
    """The package index's version of an installed llama-cpp-python: ours carries a local label
    (`0.3.36+raygate.5`), which `pip download` and the pins do not take."""
    return installed.split("+")[0]


def sdist(version: str, into: Path = CACHE / "sdist") -> Path:
    """The llama-cpp-python `version` sdist from the package index (pip's cache first)."""
    path = into / f"llama_cpp_python-{version}.tar.gz"
    if not path.exists():
        into.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps"]
        subprocess.run([*pip, "-d", str(into), f"llama-cpp-python=={version}"], check=True, stdout=sys.stderr)
    return path


def _patches() -> list[Path]:
    return sorted(PATCHES.glob("*.patch"))


def _key(version: str, cmake_args: str) -> str:
    digest = hashlib.sha256(f"{version}\0{cmake_args}\0".encode())
    for patch in _patches():
        digest.update(patch.read_bytes())
    return digest.hexdigest()[:16]


def build(version: str, cmake_args: str) -> Path:
    """The patched wheel, built first if the cache has none."""
    cached = CACHE / "wheels" / _key(version, cmake_args)
    wheels = sorted(cached.glob("llama_cpp_python-*.whl"))
    if wheels:
        return wheels[0]
    with tempfile.TemporaryDirectory(prefix="raygate-llama-cpp-") as tmp:
        with tarfile.open(sdist(version)) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # Python before 3.11.4 (Debian bookworm's 3.11.2): the index's own sdist
                tar.extractall(tmp)
        src = Path(tmp) / f"llama_cpp_python-{version}"
        for patch in _patches():
            print(f"applying {patch.name}", file=sys.stderr)
            apply = ["patch", "-p1", "--forward", "--batch", "-d", str(src)]
            with patch.open("rb") as diff:
                subprocess.run(apply, stdin=diff, check=True, stdout=sys.stderr)
        init = src / "llama_cpp" / "__init__.py"
        labelled = f'__version__ = "{version}+{LOCAL_LABEL}"'
        text, n = re.subn(r'__version__ = "[^"]+"', labelled, init.read_text())
        if n != 1:
            sys.exit(f"{init}: no __version__ to label")
        init.write_text(text)
        print(f"building llama-cpp-python {version}+{LOCAL_LABEL} (once; minutes)", file=sys.stderr)
        out = Path(tmp) / "wheel"
        env = {**os.environ, "CMAKE_ARGS": cmake_args}
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(out), str(src)]
        subprocess.run(pip, check=True, env=env, stdout=sys.stderr)
        cached.mkdir(parents=True, exist_ok=True)
        (wheel,) = out.glob("llama_cpp_python-*.whl")
        return Path(shutil.copy2(wheel, cached / wheel.name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also copy the wheel into this folder")
    parser.add_argument("--version", help="llama-cpp-python's version (default: constraints.txt's pin)")
    args = parser.parse_args()
    wheel = build(args.version or pinned_version(), os.environ.get("CMAKE_ARGS", ""))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        wheel = Path(shutil.copy2(wheel, args.out / wheel.name))
    print(wheel)


if __name__ == "__main__":
    main()
