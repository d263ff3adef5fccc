"""What a model does beyond text in, text out: its `reasoning:` and `vision:` blocks.

Each block, left out, means the model does not (it does not think; it reads no images). Their own
room because the engines and the serving layer read them (to split thinking from answer, to admit
images) apart from the rest of the spec, and Ollama's `/api/show` reports them as the model's
`thinking` and `vision` capabilities.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raygate.protocol.base import StrictModel
from raygate.protocol.model_source import ModelSource

ReasoningParser = Literal["auto", "deepseek_r1", "qwen3", "harmony", "openai_gptoss", "none"]


class ReasoningConfig(StrictModel):
    """A reasoning model's `reasoning:` block: how its thinking is told from its answer
    (docs/reasoning.md). A model without the block is served as if it did not think."""

    parser: ReasoningParser = Field(
        "auto",
        description="How the output is split: `deepseek_r1` (thinking until `</think>`, all "
        "thinking when it never comes), `qwen3` (thinking only inside `<think>...</think>`, or "
        "from the start when the prompt opened it; `enable_thinking` turns it off), `none`, or "
        "`harmony` (gpt-oss's channels: thinking is the `analysis` channel, the answer the `final` "
        "one; `openai_gptoss`, vLLM's name, is the same), "
        "`auto`: read from the chat template (`harmony` when it has `<|channel|>`, `qwen3` when it "
        "has `<think>` and `enable_thinking`, `deepseek_r1` when it has `<think>` alone, else `none`).",
    )
    budget: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="Thinking tokens a request may spend before the engine writes the end "
        "marker itself and the answer begins (a request's own budget wins); None: unbounded.",
    )


class VisionConfig(StrictModel):
    """A vision-language model's `vision:` block (docs/vision.md): it reads images, and how many and
    how large. A model without it is text-only: a request with an image is a 400 naming it."""

    projector: ModelSource | None = Field(
        None,
        description="llama.cpp: the multimodal projector GGUF (`mmproj`) beside the model's; "
        "vLLM reads the vision tower from the model folder and takes none.",
    )
    max_images: int = Field(8, ge=1, le=256, description="Images one request may carry.")
    max_image_bytes: int = Field(
        20 * 1024 * 1024, ge=1024, le=512 * 1024 * 1024, description="Encoded size of one image."
    )
    max_image_pixels: int = Field(
        33_177_600,
        ge=64,
        le=1_000_000_000,
        description="Width times height of one image once decoded (the default is 8K UHD); a larger "
        "one, a decompression bomb included, is refused before it is decoded.",
    )
