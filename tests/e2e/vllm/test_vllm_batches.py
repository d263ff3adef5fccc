"""The Files and Batch API suite (tests/support/suites/batches.py) rerun on the vLLM-served models:
this folder's conftest points `client` and `base_url` at the vLLM gateway, so batch lines go
through vLLM's engine and must come back shaped like its interactive answers.

Left out: keys, quotas and the restart (the store and the runner are the gateway's, not the
engine's: tests/e2e/test_batches.py covers them)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import ray

from tests.support.models import CHAT_MODEL
from tests.support.suites.batches import (  # noqa: F401
    test_chat_batch_completes_with_interactive_shaped_bodies,
    test_embeddings_batch,
)
from tests.support.vllm import VLLM_MAX_NUM_SEQS, VllmDeployment


def _engine_stats(vllm: VllmDeployment) -> Any:
    return ray.get(vllm.replica(CHAT_MODEL).stats.remote())


async def test_a_better_priority_starts_before_the_requests_queued_in_vllm(
    async_client: openai.AsyncOpenAI, vllm: VllmDeployment
) -> None:
    """vLLM's priority scheduling (`scheduling_policy: priority`, each request's `priority` passed
    on): with every one of the EngineCore's `max_num_seqs` slots taken and more requests queued in
    its own waiting queue, a request of a better (lower) priority sent after them is scheduled at
    the first free slot, ahead of every request queued before it; under first come first served it
    would start last. Batch lines reach vLLM at a priority below every interactive one
    (`translate.vllm_priority`). The running requests end one after another (each asks for more
    tokens than the one before), so slots free one at a time and the order is the scheduler's."""
    order: list[str] = []
    all_started = asyncio.Event()

    async def stream(name: str, priority: int, max_tokens: int) -> None:
        chunks = await async_client.completions.create(
            model=CHAT_MODEL,
            prompt=f"Count from 1 to 1000: 1, 2, 3, ({name})",
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_body={"priority": priority, "ignore_eos": True},
        )
        async for _ in chunks:
            if name not in order:
                order.append(name)
                if len(order) == VLLM_MAX_NUM_SEQS:
                    all_started.set()

    running = [asyncio.create_task(stream(f"run-{i}", 5, 64 + 16 * i)) for i in range(VLLM_MAX_NUM_SEQS)]
    await all_started.wait()  # every slot holds one that has started
    queued = [asyncio.create_task(stream(f"queued-{i}", 5, 4)) for i in range(3)]
    while (await asyncio.to_thread(_engine_stats, vllm)).core_waiting < len(queued):
        pass
    assert not any(name.startswith("queued") for name in order), order  # still waiting in vLLM
    urgent = asyncio.create_task(stream("urgent", -5, 4))
    await asyncio.gather(*running, *queued, urgent)
    after = order[VLLM_MAX_NUM_SEQS:]
    assert after[0] == "urgent" and sorted(after[1:]) == ["queued-0", "queued-1", "queued-2"], order
