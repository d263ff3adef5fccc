"""Ladder step L0: the engine called in-process, no HTTP, no Ray, timed like an HTTP request
(TTFT = call -> first delta with text; one "chunk" per delta with text)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.client import Runner
from bench.metrics import RequestResult
from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.backends.engines.model_files import anchor_source
from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import GenerateRequest, SamplingParams


async def load_engine(config: ModelConfig, base_dir: Path) -> Engine:
    config = config.model_copy(update={"source": config.source and anchor_source(config.source, base_dir)})
    engine = make_engine(config)
    await engine.start()
    return engine


def engine_worker_factory(
    engine: Engine, prompt: str, sampling: SamplingParams, expected_tokens: int | None
) -> Callable[[], Awaitable[tuple[Runner, Callable[[], Awaitable[None]]]]]:
    ids = itertools.count()

    async def make() -> tuple[Runner, Callable[[], Awaitable[None]]]:
        async def run(result: RequestResult) -> None:
            request = GenerateRequest(f"l0-{next(ids)}", dataclasses.replace(sampling), prompt=prompt)
            result.sent = time.perf_counter()
            tokens = 0
            async for delta in engine.generate(request):
                now = time.perf_counter()
                tokens = delta.completion_tokens
                if delta.text:
                    if result.first_token is None:
                        result.first_token = now
                    result.chunk_times.append(now)
            result.end = time.perf_counter()
            result.output_tokens = tokens
            if expected_tokens is not None and tokens < expected_tokens:
                result.status = "incomplete"
            else:
                result.ok, result.status = True, "200"

        async def close() -> None:
            return None

        return run, close

    return make
