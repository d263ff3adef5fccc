"""`make setup` (and the image) install Raygate's build of llama-cpp-python: the pinned sdist with
the patches in scripts/llama_cpp/ (a flash-attention kernel that reads a Q8_0 V row straight
into its accumulator; the same numbers, docs/performance.md). A plain `pip install` of the pin
would run, silently, the slower stock kernel: this catches a set-up that stops installing ours."""

from __future__ import annotations

from importlib import metadata

from scripts.llama_cpp_wheel import LOCAL_LABEL, pinned_version


def test_the_installed_llama_cpp_is_the_patched_build() -> None:
    assert metadata.version("llama_cpp_python") == f"{pinned_version()}+{LOCAL_LABEL}"
