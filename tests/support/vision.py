"""`tiny-vlm`, the vision-language model the vision tests serve: `models/build_vision_model.py`
builds it once per machine (Idefics3 on the shipped SmolLM2, a small random SigLIP tower) as an HF
folder, a GGUF and its projector; this runs the script (a cache hit prints the paths at once), and
makes the test images."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from functools import cache
from typing import Any

from raygate.protocol.generation import ImageInput
from tests.support.gateway import REPO

MODEL = "tiny-vlm"


@cache
def tiny_vlm() -> dict[str, str]:
    """The builder's paths: `hf` (folder), `gguf`, `mmproj`; built if missing."""
    out = subprocess.run(
        [sys.executable, str(REPO / "models" / "build_vision_model.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    paths: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return paths


def image(color: str, size: tuple[int, int] = (96, 96), fmt: str = "PNG") -> ImageInput:
    """A plain image of one colour with a white diagonal, as the gateway hands it to an engine."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, color)
    ImageDraw.Draw(img).line((0, 0, *size), fill="white", width=3)
    buf = io.BytesIO()
    img.save(buf, fmt)
    data = buf.getvalue()
    return ImageInput(
        data=data, digest=hashlib.sha256(data).hexdigest(), width=size[0], height=size[1], format=fmt
    )


def vlm_spec(**kw: Any) -> dict[str, Any]:
    """A llama.cpp deployment of `tiny-vlm` with its projector, small enough to sit beside the
    default models of the shared test gateway."""
    paths = tiny_vlm()
    spec: dict[str, Any] = {
        "name": MODEL,
        "source": {"path": paths["gguf"]},
        "vision": {"projector": {"path": paths["mmproj"]}},
        "num_cpus": 0.25,
        "engine": {"n_ctx": 2048, "n_threads": 1, "n_seq_max": 4},
    }
    return {**spec, **kw}
