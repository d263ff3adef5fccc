"""Keeping Python's garbage collector off the startup heap of a long-lived serving process.

A replica holding vLLM (torch, transformers, Ray) tracks ~700k objects after its start, a gateway
(FastAPI, pydantic, Ray) ~160k. Every full (generation-2) collection walks all of them: measured
on this 2-core machine under load, ~0.8-1.1 s for the replica's heap and ~0.3-0.4 s for the
gateway's, with the event loop (and every stream it carries) stopped meanwhile. A streamed request
allocates enough for such collections to come every few hundred tokens, which is how a client saw
gaps of seconds between two tokens where `vllm serve`, on the same engine, did not (issue #52).

vLLM's own server does what `freeze_startup_heap` does, once its engine is up
(`vllm.utils.gc_utils.freeze_gc_heap`): collect, then move every surviving object to the
permanent generation, which later collections skip. Objects made afterwards are collected as
usual; a frozen object is still freed when its reference count drops to zero, only a reference
cycle among frozen objects stays (what was alive at start-up, and is meant to live as long).
Standard library only: the gateway (`server/`) and the replica actor (`backends/cluster/`) both
call it.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect every generation, then freeze what survives. Returns how many objects are frozen.

    Called once a process has loaded what it keeps for its life (the replica after its engine
    started, the gateway before it serves) and again after a reload: later calls add the new
    survivors."""
    gc.collect(0)
    gc.collect(1)
    gc.collect(2)
    gc.freeze()
    return gc.get_freeze_count()
