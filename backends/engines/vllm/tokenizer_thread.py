"""Every call on vLLM's tokenizer from the engine runs on one thread of its own.

Why one: vLLM makes its Hugging Face tokenizer "thread-safe" as a pool (`maybe_make_thread_pool`
in vllm/tokenizers/hf.py): it holds `renderer_num_workers + 1` copies, two by default, and a
caller that finds none free deep-copies the whole tokenizer, a copy that then stays in the pool.
For SmolLM2's tokenizer a copy takes 115-135 ms on an idle 2-core machine, with the GIL held. Run
through `asyncio.to_thread` (up to min(32, cores + 4) threads), the first burst of concurrent
requests made a copy per request beyond two: at c=8 a profile of the replica (py-spy, the first
burst after a start) found 35 % of its samples in `copy.deepcopy`, while every stream it relays
waited for the GIL. vLLM's own server tokenizes on its renderer's one thread, as this does. Prompts
are tokenized one after another either way: the GIL let no two run at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class TokenizerThread:
    """Runs callables that use the tokenizer (chat templates, encodes, decodes) off the event
    loop, one at a time, on one thread."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))
