"""llama.cpp's own `llama-server`, built from the llama.cpp sources the pinned llama-cpp-python
vendors, so the peer runs the kernels Raygate's engines run (but for the patches Raygate's build
adds, scripts/llama_cpp/).

    python -m bench.llama_server        # build (once; minutes) and print the binary's path

The sdist comes from the package index (scripts/llama_cpp_wheel.py's `sdist`, which Raygate's own
patched build uses too; this one stays unpatched: the peer is llama.cpp as published), and the
build is cached under ~/.cache/raygate/llama-server/llama_cpp_python-<version>/: later runs
find the binary and start at once. CPU flags are the Makefile's portable ones (`CMAKE_ARGS`,
exported by `make`), with the server turned on; only the `llama-server` target is built.

    python -m bench.llama_server native # the same sources built for this CPU (GGML_NATIVE=ON)

llama.cpp's release binaries pick the best CPU variant at run time (AVX-512 where present); the
`native` build is that peer as its users run it, built once per machine in `build-native/`
(the portable one in `build/`). `make bench` runs both and holds Raygate to the faster.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path

from scripts.llama_cpp_wheel import index_version, sdist

log = logging.getLogger("bench")

CACHE = Path.home() / ".cache" / "raygate" / "llama-server"
# The Makefile's CMAKE_ARGS, for a run outside `make` (which exports its own).
PORTABLE = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
# What the peer needs on top: the server and its tools, and nothing that downloads.
SERVER = (
    "-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
    "-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "
    "-DBUILD_SHARED_LIBS=OFF"
)


# The two builds: the Makefile's portable flags, and llama.cpp's own default (this CPU's best).
VARIANTS = ("portable", "native")
NATIVE = "-DGGML_NATIVE=ON"


def cmake_args(variant: str = "portable") -> list[str]:
    """The variant's CPU flags (the Makefile's for `portable`), with the switches that would skip
    the server dropped."""
    flags = shlex.split(NATIVE if variant == "native" else os.environ.get("CMAKE_ARGS", PORTABLE))
    ours = shlex.split(SERVER)
    overridden = {a.split("=", 1)[0] for a in ours}
    return [a for a in flags if a.split("=", 1)[0] not in overridden] + ours


def binary_path(variant: str = "portable", version: str | None = None) -> Path:
    """Where the `variant` build of llama-cpp-python `version` (the installed one by default) puts
    `llama-server`, built or not."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    version = index_version(version or metadata.version("llama_cpp_python"))
    src = CACHE / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    return src / ("build" if variant == "portable" else f"build-{variant}") / "bin" / "llama-server"


def binary(version: str | None = None, variant: str = "portable") -> Path:
    """The `llama-server` of llama-cpp-python `version` (the installed one by default) built as
    `variant` says, built first if the cache has none."""
    exe = binary_path(variant, version)
    build, src = exe.parent.parent, exe.parent.parent.parent
    version = index_version(version or metadata.version("llama_cpp_python"))
    if exe.exists():
        return exe
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (src / "CMakeLists.txt").exists():
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tarfile.open(sdist(version)) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            tar.extractall(CACHE, members=members, filter="data")
    log.info("building llama-server %s, %s (once; minutes)", version, variant)
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *cmake_args(variant)], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], check=True)
    return exe


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    print(binary(variant=sys.argv[1] if len(sys.argv) > 1 else "portable"))
