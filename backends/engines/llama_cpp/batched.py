"""llama.cpp with several sequences per decode call (continuous batching): `engine: {n_seq_max: N}`.

Why: through `Llama.generate`, one llama.cpp instance decodes one token of one sequence per
`llama_decode`, so concurrent requests wait in line (as in `llama_cpp.server`). For a small model
on a CPU, one decode of N sequences' tokens costs far less than N decodes (the weights are read
once per call), so one replica serves several streams for little more than the price of one.

How: one scheduler thread owns a context with `n_seq_max` KV sequences (one per slot, `n_ctx`
tokens each). Every `llama_decode` carries the next token of each running sequence first, then
prompt chunks of newly admitted ones; sequences join and leave between decodes.

Requests sent together start together, as llama-server's one decode of every waiting prompt
starts them: an idle engine gathers the ones arriving with the first (`_gather`), their prompts
share each decode's room evenly (`decode_batch._shared`), one that opens as another does copies
that prefix from the other's slot instead of evaluating it again (`decode_batch.donor`), and a first token
waits while no stream runs and prompts fed with it are still going in (`decode_batch.holds_first`). Started
one after another, the first streams would stall through each later prompt's decodes (1-1.8 s
gaps at c=8 on 2 cores) and finish early, so that every next request's prompt stalled the
others again.

The slots are also a prompt cache, as llama-server's are, with host copies of evicted slots
behind them (`slots.py`). The logits at the last position of the latest prompts are kept too
(one row each): a prompt seen exactly before (a retry, a regenerated answer) draws its first token
from them the moment it arrives, with no decode, where llama-server evaluates its last token again.
`engine: {prompt_cache: false}` evaluates every prompt whole (greedy output is the same).

Everything per request is shared with the one-sequence engine, as objects both hold rather than
by inheritance: the prompt side (`model.LlamaModel`: chat template, fill-in-the-middle, the
context-length check, the sampler with logit bias, penalties and grammars) and what each sampled
token goes through (`sequence.SequenceOutput`: logprobs, stop strings, UTF-8 reassembly, tool-call
parsing, the deltas). Only the decode loop differs, and with it where the logits are: each
sequence samples from, and scores, its own rows of the shared batch. The scheduler thread feeds
each request's stream directly (`raygate.backends.streams.ThreadFeed`); no thread waits per request.

Backpressure: each stream's pump is bounded, but the scheduler must not wait on one stream (every
other sequence would stall with it). Its feeds never block; a sequence whose reader is a whole
bound behind (`feed.full`: the client reads nothing) is left out of the next decodes, keeping its
slot and its sampled token, until its reader catches up or the stream is closed (cancel).

LoRA adapters (`lora.py`): each decode carries the sequences of one adapter set, so a step with
requests for several sets makes one `llama_decode` per set, switching the context's set between
them (never mixing sets in one decode). The kept logits serve base-model prompts only, as the
slots' host store does.

Prompt logprobs (completions `echo` + `logprobs`) need the logits of every prompt position, so such
a sequence asks for them on each prompt token it feeds, and does not reuse a cached prefix.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from raygate.backends.engines.base import loaded
from raygate.backends.engines.llama_cpp import logprobs, prefix_reuse
from raygate.backends.engines.llama_cpp.decode_batch import (
    INTERACTIVE_RETURN_S,
    RunningSequence,
    fill,
    holds_first,
)
from raygate.backends.engines.llama_cpp.kept_logits import KeptLogits
from raygate.backends.engines.llama_cpp.lora import LoraAdapters, LoraKey
from raygate.backends.engines.llama_cpp.model import LlamaModel, decode_error, llama_kwargs
from raygate.backends.engines.llama_cpp.model_engine import LlamaModelEngine
from raygate.backends.engines.llama_cpp.prompt_store import PromptStore
from raygate.backends.engines.llama_cpp.sequence import SequenceOutput
from raygate.backends.engines.llama_cpp.slots import Slots
from raygate.backends.engines.llama_cpp.vision import Projector
from raygate.backends.streams import Pump
from raygate.protocol.capabilities import ReasoningConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    FinishReason,
    GenerateRequest,
)

logger = logging.getLogger(__name__)

# The `Llama` object is kept for the tokenizer and chat template only; its own context stays tiny.
_TOKENIZER_CTX = 64
# Deltas a sequence may run ahead of its stream's reader before it is paused.
MAX_QUEUED_DELTAS = 64
# When every running sequence is paused (no reader reads), how long the scheduler sleeps before
# looking again. Only then: a step with any work never sleeps.
PAUSED_POLL_SECONDS = 0.01
# An idle engine's first decode waits for the prompts arriving with the first one (`_gather`), so
# that they are fed together (`decode_batch._shared`) and their streams start, and end, in step.
# Requests sent at once reach the scheduler over a few ms each (the gateway and the replica parse,
# route and tokenize them in turn; measured 0-8 ms apart for the first three of eight at c=8, the
# rest 100-140 ms later, once the first prompt's decode took both cores), so it waits while they
# keep coming, each gap at most ARRIVAL_QUIET_S, all of them at most ARRIVAL_WINDOW_S.
ARRIVAL_QUIET_S = 0.010
ARRIVAL_WINDOW_S = 0.060
# Unless the engine just went idle: then as many requests as ended in its last RETURNING_S are
# likely its clients' next ones (a closed loop, an agent's next step), and it waits for that many
# (at most ARRIVAL_WINDOW_S), no quiet gap after: one stream's next request starts at once.
RETURNING_S = 0.25
# While only batch lines run and they yield (`INTERACTIVE_RETURN_S`): looking for the returning
# request more often than that, since it is what the wait is for.
YIELD_POLL_SECONDS = 0.002


class BatchedLlamaCppEngine(LlamaModelEngine):
    """`backend: llama_cpp` with `n_seq_max` > 1: one scheduler thread decodes every running sequence in
    shared batches (module docstring). Generation only."""

    def __init__(
        self,
        model_path: str,
        *,
        engine_kwargs: dict[str, Any],
        reasoning: ReasoningConfig | None = None,
        projector: str | None = None,
        name: str = "this model",
        max_loras: int | None = None,
    ) -> None:
        """`projector`: a vision model's mmproj GGUF (`vision.py`); `name`: the model's, for errors;
        `max_loras`: LoRA adapters kept loaded at once (`lora.py`; None: all)."""
        super().__init__()
        self._reasoning = reasoning
        self._projector_path = projector
        self._name = name
        kwargs, cache = llama_kwargs(engine_kwargs, generation=True)
        self._n_seq = int(kwargs.pop("n_seq_max", 1))
        self._seq_ctx = int(kwargs.pop("n_ctx"))
        self._n_batch = int(kwargs.pop("n_batch", 512))
        self._model_path = model_path
        self._kwargs = {**kwargs, "n_ctx": _TOKENIZER_CTX, "verbose": False}
        # None: no sequence, only a wake-up for `_commands` (work for the scheduler thread).
        self._incoming: queue.SimpleQueue[RunningSequence | None] = queue.SimpleQueue()
        self._commands: queue.SimpleQueue[tuple[Callable[[], None], Future[None]]] = queue.SimpleQueue()
        self._lora = LoraAdapters(max_loras)
        self._model: LlamaModel | None = None
        self._ctx: Any = None
        self._arrivals = itertools.count()
        # Sequences waiting for a slot, in `RunningSequence.queue_key` order (scheduler thread only).
        self._pending: list[RunningSequence] = []
        self._slots = Slots(self._n_seq, PromptStore(cache.ram_bytes), cache.enabled, self._stats)
        self._kept = KeptLogits(self._n_seq)
        self._interactive_ended = -INTERACTIVE_RETURN_S  # time.monotonic() of the latest end
        self._ends: collections.deque[float] = collections.deque(maxlen=self._n_seq)  # (monotonic)

    async def start(self) -> None:
        import llama_cpp
        from llama_cpp import _internals

        model = await asyncio.to_thread(
            LlamaModel.load,
            self._model_path,
            embedding=False,
            kwargs=self._kwargs,
            reasoning_config=self._reasoning,
        )
        # `Llama`'s own context settings (flash attention, rope, KV types...), so the numbers,
        # and with them greedy outputs, match the one-sequence engine; only the shape differs.
        params = llama_cpp.llama_context_params.from_buffer_copy(model.llm.context_params)
        params.n_ctx = self._seq_ctx * self._n_seq
        params.n_seq_max = self._n_seq
        params.n_batch = params.n_ubatch = self._n_batch
        params.kv_unified = False  # each sequence its own n_ctx cells: none can starve another
        self._ctx = _internals.LlamaContext(model=model.llm._model, params=params, verbose=False)
        model.name = self._name
        if self._projector_path is not None:
            model.projector = await asyncio.to_thread(
                Projector.load,
                self._projector_path,
                model.llm._model.model,
                int(self._kwargs["n_threads_batch"]),
            )
        self._model = model
        threading.Thread(target=self._schedule, name="llama-batch", daemon=True).start()

    @property
    def context_length(self) -> int:
        return self._seq_ctx

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        loaded(self._model)
        raise BadRequestError("This model does not serve embeddings.", param="model")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        """Hand the sequence to the scheduler and relay what it emits."""
        model = loaded(self._model)
        job = await model.prepare(request, self.context_length)
        with self._running(request.request_id) as run:
            async with Pump[Delta](MAX_QUEUED_DELTAS) as pump:
                feed = pump.thread_feed(run.cancel, block=False)
                out = SequenceOutput(model.llm, request, job, feed.put, self._stats)
                top = request.sampling.prompt_logprobs
                seq = RunningSequence(job.prompt, job.sampler, out, feed, prompt_top=top)
                seq.lora = self._lora.key(request.lora)
                seq.images = job.images
                seq.rank = request.rank
                if not self._draw_kept(seq):
                    self._incoming.put(seq)
                async for delta in pump:
                    # Out with its last delta: a consumer that closes on reading it left nothing.
                    run.ended = delta.finish_reason is not None
                    yield delta
                run.ended = True

    def _draw_kept(self, seq: RunningSequence) -> bool:
        """Draw the first token of a prompt whose logits are kept, at once, even while a decode
        runs: logits are a function of the prompt alone, whatever a slot holds by the time the
        sequence is admitted. Returns True if the sequence ended there (it needs no slot)."""
        usable = self._slots.enabled and seq.prompt_top is None and not seq.lora
        kept = self._kept.get(seq.prompt) if usable else None
        if kept is None:
            return False
        seq.out.builder.cached_tokens = len(seq.prompt)
        self._stats.prompt_cache_logits_reused_total += 1
        ended = self._step(seq, -1, kept)
        if ended:
            self._stats.count_prompt_cache(len(seq.prompt))
        return ended

    # -- the scheduler thread --------------------------------------------------------------

    def _schedule(self) -> None:
        from llama_cpp import _internals

        batch = _internals.LlamaBatch(n_tokens=self._n_batch, embd=0, n_seq_max=1, verbose=False)
        # On the tokenizer's context (the same settings, so the same kernels), and on this
        # thread: a decode on another thread leaves OpenMP's threads for it, which slowed
        # every later step of this one by ~50 % (measured).
        llm = loaded(self._model).llm
        self._slots.bind(self._ctx, prefix_reuse.reevaluated_tokens(llm) if self._slots.enabled else None)
        running: dict[int, RunningSequence] = {}
        while True:
            try:
                self._schedule_step(batch, running)
            except Exception as exc:
                # A fault of the scheduler's own (a decode's is handled inside the step): left to
                # end the thread, it would leave every stream, and every later request, waiting
                # for ever. What it held fails; the engine goes on with empty slots.
                logger.exception("the batched llama.cpp scheduler failed a step")
                self._fail_running(running, exc)
                for seq in self._pending:
                    self._fail(seq, exc)
                self._pending.clear()

    def _schedule_step(self, batch: Any, running: dict[int, RunningSequence]) -> None:
        """Admit, feed and decode once: one pass of the scheduler thread's loop."""
        self._run_commands()
        self._admit(running)
        for slot, seq in list(running.items()):
            if seq.cancel.is_set():
                self._finish(seq, "abort")
                del running[slot]
        for slot, seq in list(running.items()):
            if seq.images and not self._feed_images(slot, seq):
                del running[slot]
        self._slots.share_prefixes(running)
        self._release_first_tokens(running)
        if not running:
            return
        groups: dict[LoraKey, dict[int, RunningSequence]] = {}
        for slot, seq in running.items():
            groups.setdefault(seq.lora, {})[slot] = seq
        decoded = False
        yields = time.monotonic() - self._interactive_ended < INTERACTIVE_RETURN_S
        for key, group in groups.items():
            try:
                outputs, scored = fill(batch, group, self._slots.cached, self._n_batch, batch_yields=yields)
                if not batch.batch.n_tokens:  # every sequence of the group waits for its reader
                    continue
                self._lora.apply(self._ctx.ctx, key)
                self._decode_batch(batch)
                decoded = True
            except Exception as exc:
                self._fail_running(running, exc)
                break
            for slot, first_row, start, n in scored:
                if not self._score_prompt(running[slot], first_row, start, n):
                    del running[slot]
            for slot, row in outputs:
                if slot not in running:
                    continue
                if holds_first(running[slot], running):
                    running[slot].first_logits = self._logits(row).copy()
                elif self._step(running[slot], row):
                    del running[slot]
        self._release_first_tokens(running)
        if running and not decoded:  # paused readers, or only batch lines while they yield
            time.sleep(YIELD_POLL_SECONDS if yields else PAUSED_POLL_SECONDS)

    def _fail_running(self, running: dict[int, RunningSequence], exc: BaseException) -> None:
        """Fail every running sequence and empty its slot."""
        for slot, seq in running.items():
            self._slots.drop(slot)
            self._fail(seq, exc)
        running.clear()

    def _release_first_tokens(self, running: dict[int, RunningSequence]) -> None:
        """Draw the held first tokens (`decode_batch.holds_first`) once no prompt they wait for is
        being fed."""
        held = [(slot, seq) for slot, seq in running.items() if seq.first_logits is not None]
        if not held or any(holds_first(seq, running) for _, seq in held):
            return
        for slot, seq in held:
            kept, seq.first_logits = seq.first_logits, None
            if self._step(seq, -1, kept):
                del running[slot]

    def _logits(self, row: int) -> np.ndarray:
        """Row `row` of the last decode's logits: a view into llama.cpp's buffer, which the next
        decode overwrites."""
        n_vocab = loaded(self._model).llm.n_vocab()
        logits = self._llama.llama_get_logits_ith(self._ctx.ctx, row)
        return np.ctypeslib.as_array(logits, shape=(n_vocab,))

    def _step(self, seq: RunningSequence, row: int, kept: np.ndarray | None = None) -> bool:
        """Sample this sequence's next token from its own row of the batch's logits (or from
        `kept`, its prompt's logits the cache kept). A failure here (a grammar that allows
        nothing, say) ends this sequence only."""
        try:
            if seq.first:
                seq.first = False
                if kept is None and self._slots.enabled and seq.prompt_top is None and not seq.lora:
                    self._kept.put(seq.prompt, self._logits(row))
            token = seq.sampler.sample(self._ctx.ctx, row, kept)
            ended = seq.out.push(token, self._ctx.ctx, row, kept)
        except Exception as exc:
            self._fail(seq, exc)
            return True
        if ended:
            self._end(seq)
        else:
            seq.next_token = token
        return ended

    def _feed_images(self, slot: int, seq: RunningSequence) -> bool:
        """Evaluate the image spans the sequence's prompt has reached (`vision.py`), each on a
        decode of its own, under the sequence's adapters. Returns False if one failed, which ends
        this sequence only (its slot's cells are dropped: a half-decoded image is no prefix)."""
        projector = loaded(self._model).projector
        while (span := seq.image_at_fed()) is not None:
            try:
                assert projector is not None and len(self._slots.cached[slot]) == seq.fed
                self._lora.apply(self._ctx.ctx, seq.lora)
                with self._stats.forward(span.n_tokens):
                    projector.evaluate(self._ctx.ctx, span, seq.fed, slot, self._n_batch)
            except Exception as exc:
                self._slots.drop(slot)
                self._fail(seq, exc)
                return False
            self._slots.cached[slot].extend(seq.prompt[span.start : span.end])
            seq.fed = span.end
        return True

    def _score_prompt(self, seq: RunningSequence, first_row: int, start: int, n: int) -> bool:
        """Score a prompt chunk just decoded (rows `first_row ..`). Returns False if it failed,
        which ends this sequence only."""
        assert seq.prompt_top is not None
        llm, ctx = loaded(self._model).llm, self._ctx.ctx
        try:
            if start == 0:
                seq.prompt_scores.append(logprobs.unpredicted(llm, seq.prompt[0]))
            seq.prompt_scores += logprobs.score_prompt_chunk(
                llm, ctx, seq.prompt, start, first_row, n, seq.prompt_top
            )
        except Exception as exc:
            self._fail(seq, exc)
            return False
        if start + n == len(seq.prompt):  # complete: it goes out with the first delta
            seq.out.builder.prompt_logprobs = seq.prompt_scores
        return True

    @property
    def _llama(self) -> Any:
        import llama_cpp

        return llama_cpp

    def _admit(self, running: dict[int, RunningSequence]) -> None:
        """Take waiting sequences into free slots, best class first (`_take_incoming`); a sequence
        that finds none takes the slot of a running one of a worse class (`_preempt`). One whose
        adapters have no room (every loaded one in use, `lora.py`) keeps its place, and so does
        every adapter request behind it, so a busy adapter cannot starve another one; requests for
        the base model go on past them, but batch lines only when no interactive request waits:
        a free slot is held for it, as a batch line taking it would delay it further."""
        self._take_incoming(running)
        ended = [seq.cancel.is_set() for seq in self._pending]  # while waiting, wherever queued
        if any(ended):
            for seq in itertools.compress(self._pending, ended):
                self._finish(seq, "abort")
            self._pending = [seq for seq, gone in zip(self._pending, ended, strict=True) if not gone]
        lora_blocked = interactive_waits = False
        i = 0
        while i < len(self._pending):
            seq = self._pending[i]
            if interactive_waits and seq.rank[0]:
                return  # sorted: every later one is a batch line too
            full = len(running) >= self._n_seq
            victim = self._victim(running, seq) if full else None
            if full and victim is None:
                return  # those behind rank no better: none of them may take a slot either
            if seq.lora and not seq.holds_lora:
                if lora_blocked:
                    interactive_waits = interactive_waits or not seq.rank[0]
                    i += 1
                    continue
                try:
                    seq.holds_lora = self._acquire(seq, running)
                except Exception as exc:  # its adapter's file is gone, or it was unloaded meanwhile
                    self._pending.pop(i)
                    self._fail(seq, exc)
                    continue
                if not seq.holds_lora:
                    lora_blocked = True
                    interactive_waits = interactive_waits or not seq.rank[0]
                    i += 1
                    continue
            if victim is not None and len(running) >= self._n_seq:  # `_acquire` may have freed a slot
                self._preempt(victim, running)
            self._pending.pop(i)  # its victim ranks below it: queued behind, `i` is still `seq`
            self._slots.place(seq, running)

    def _acquire(self, seq: RunningSequence, running: dict[int, RunningSequence]) -> bool:
        """Load `seq`'s adapters (`LoraAdapters.acquire`). An interactive sequence whose adapters
        find no room takes it from batch lines, as it would take a slot: running lines under
        adapters are preempted, the latest first, until its adapters fit, so a long batch line
        never holds an interactive request's adapter out. Each line resumes later, nothing lost."""
        model = loaded(self._model).llm._model.model
        if self._lora.acquire(model, self._ctx.ctx, seq.lora):
            return True
        if seq.rank[0]:
            return False
        lines = [s for s, q in running.items() if q.rank[0] and q.holds_lora and q.preemptable]
        for slot in sorted(lines, key=lambda s: running[s].queue_key(), reverse=True):
            self._preempt(slot, running)  # queued behind `seq`: its class ranks below
            if self._lora.acquire(model, self._ctx.ctx, seq.lora):
                return True
        return False

    def _take_incoming(self, running: dict[int, RunningSequence]) -> None:
        """Move the sequences handed over since the last step into `_pending`; block for one only
        when nothing runs or waits, and then gather those arriving with it (`_gather`)."""
        while True:
            try:
                idle = not running and not self._pending
                seq = self._wait() if idle else self._incoming.get_nowait()
            except queue.Empty:
                return
            if self._receive(seq) and idle:
                self._gather()

    def _receive(self, seq: RunningSequence | None) -> bool:
        """Queue a sequence handed over, or run the commands a None woke the scheduler for.
        Returns whether a sequence was queued."""
        if seq is None:
            self._run_commands()
            return False
        seq.order = next(self._arrivals)
        bisect.insort(self._pending, seq, key=RunningSequence.queue_key)
        return True

    def _gather(self) -> None:
        """Wait for the requests arriving together with the one that woke an idle engine
        (`ARRIVAL_QUIET_S`, `RETURNING_S`): fed in the same decodes, they start in step."""
        start = last = time.monotonic()
        expected = sum(1 for t in self._ends if start - t <= RETURNING_S)
        while True:
            now = time.monotonic()
            if expected:
                deadline = start + ARRIVAL_WINDOW_S if len(self._pending) < expected else now
            else:
                deadline = min(start + ARRIVAL_WINDOW_S, last + ARRIVAL_QUIET_S)
            if now >= deadline:
                return
            try:
                seq = self._incoming.get(timeout=deadline - now)
            except queue.Empty:
                return
            if self._receive(seq):
                last = time.monotonic()

    @staticmethod
    def _victim(running: dict[int, RunningSequence], seq: RunningSequence) -> int | None:
        """The slot `seq` may take from a running sequence, as vLLM's priority scheduling does: the
        worst class, then the latest arrival, of those ranked below `seq`; None if none is."""
        below = [slot for slot, other in running.items() if other.rank > seq.rank and other.preemptable]
        if not below:
            return None
        return max(below, key=lambda slot: running[slot].queue_key())

    def _preempt(self, slot: int, running: dict[int, RunningSequence]) -> None:
        """Take `slot` from its sequence, which waits again with its arrival kept. Nothing it did is
        lost: its prompt becomes every token its cells hold (the prompt and what it generated; the
        token it sampled last stays its next), and its cells stay in the slot until the new sequence
        overwrites them, being copied to the host store first (`_place`), from where it resumes.
        Its adapters are released while it waits, and acquired again when it resumes."""
        seq = running.pop(slot)
        if seq.fed >= len(seq.prompt):
            seq.prompt = list(self._slots.cached[slot])
        seq.fed, seq.slot, seq.resumed, seq.follows, seq.first_logits = 0, -1, True, None, None
        if seq.holds_lora:
            seq.holds_lora = False
            self._lora.release(self._ctx.ctx, seq.lora)
        self._stats.preemptions_total += 1
        bisect.insort(self._pending, seq, key=RunningSequence.queue_key)

    def _wait(self) -> RunningSequence | None:
        """The next sequence, when none runs; before waiting, the slots a new prompt is likely to
        take go to the host store (`Slots.store_likely`), outside any request's time to first token."""
        try:
            return self._incoming.get_nowait()
        except queue.Empty:
            pass
        self._slots.store_likely(lambda: not self._incoming.empty())
        return self._incoming.get()

    # -- LoRA adapters (lora.py): loaded and freed on the scheduler thread ------------------------

    async def load_adapter(self, name: str, path: str) -> None:
        model = loaded(self._model).llm._model.model
        await self._on_scheduler(lambda: self._lora.register(model, self._ctx.ctx, name, path))

    async def unload_adapter(self, name: str) -> None:
        """Refused to new requests at once; the running ones finish under it, then it is freed."""
        loaded(self._model)
        await self._on_scheduler(lambda: self._lora.unregister(self._ctx.ctx, name))

    def _on_scheduler(self, work: Callable[[], None]) -> asyncio.Future[None]:
        done: Future[None] = Future()
        self._commands.put((work, done))
        self._incoming.put(None)  # wakes a scheduler that waits for a sequence
        return asyncio.wrap_future(done)

    def _run_commands(self) -> None:
        while True:
            try:
                work, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                work()
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

    def _decode_batch(self, batch: Any) -> None:
        with self._stats.forward(batch.batch.n_tokens):
            rc = self._llama.llama_decode(self._ctx.ctx, batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _finish(self, seq: RunningSequence, reason: FinishReason) -> None:
        seq.out.finish(reason)
        self._end(seq)

    def _fail(self, seq: RunningSequence, exc: BaseException) -> None:
        self._end(seq, decode_error(exc))

    def _end(self, seq: RunningSequence, error: BaseException | None = None) -> None:
        """The scheduler is done with `seq`: free its sampler and its adapters, end (or fail) its
        stream."""
        self._ends.append(time.monotonic())
        if not seq.rank[0]:
            self._interactive_ended = self._ends[-1]
        if seq.holds_lora:
            seq.holds_lora = False
            self._lora.release(self._ctx.ctx, seq.lora)
        seq.sampler.close()
        seq.feed.close(error)
