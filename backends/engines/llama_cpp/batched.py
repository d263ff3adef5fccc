"""llama.cpp with several sequences per decode call (continuous batching): `engine: {n_seq_max: N}`.

Why: through `Llama.generate`, one llama.cpp instance decodes one token of one sequence per
`llama_decode`, so concurrent requests wait in line (as in `llama_cpp.server`). For a small model
on a CPU, one decode of N sequences' tokens costs far less than N decodes (the weights are read
once per call), so one replica serves several streams for little more than the price of one.

How: one scheduler thread owns a context with `n_seq_max` KV sequences (one per slot, `n_ctx`
tokens each). Every `llama_decode` carries the next token of each running sequence first, then
prompt chunks of newly admitted ones; sequences join and leave between decodes. Each slot remembers
the tokens in its KV cache, and a new prompt goes to the free slot sharing the longest prefix with
it, which is then reused (as `Llama.generate` does for its single sequence).

Everything per request is `LlamaCppEngine`'s: prompt, chat template and fill-in-the-middle, the
context-length check, the sampler (`llama_cpp_sampling.build_sampler`: logit bias, penalties,
grammars for `response_format` and tools), and what each sampled token goes through
(`llama_cpp_sequence.SequenceOutput`: logprobs, stop strings, UTF-8 reassembly, tool-call parsing,
the deltas). Only the decode loop moves from one thread per request to the shared scheduler, and
with it where the logits are: each sequence samples from, and scores, its own rows of the shared
batch. A request's executor thread just waits for its sequence to end.

Prompt logprobs (completions `echo` + `logprobs`) need the logits of every prompt position, so such
a sequence asks for them on each prompt token it feeds, and does not reuse a cached prefix.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from backends.engines.llama_cpp import sampling as sampling_lib
from backends.engines.llama_cpp.engine import DEFAULT_ENGINE_KWARGS, LlamaCppEngine
from backends.engines.llama_cpp.sequence import SequenceOutput
from protocol.generation import FinishReason, GenerateRequest, TokenLogprob

# The `Llama` object is kept for the tokenizer and chat template only; its own context stays tiny.
_TOKENIZER_CTX = 64


@dataclass(eq=False)
class _Sequence:
    """One request inside the scheduler."""

    prompt: list[int]
    sampler: sampling_lib.TokenSampler
    out: SequenceOutput
    cancel: threading.Event
    # Completions `echo` + `logprobs`: score every prompt token, with this many alternatives.
    prompt_top: int | None = None
    prompt_scores: list[TokenLogprob] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    slot: int = -1
    fed: int = 0  # prompt tokens already in the KV cache
    next_token: int | None = None  # sampled, not yet fed back


class BatchedLlamaCppEngine(LlamaCppEngine):
    def __init__(self, model_path: str, *, engine_kwargs: dict[str, Any]) -> None:
        kwargs = {**DEFAULT_ENGINE_KWARGS, **engine_kwargs}
        self._n_seq = int(kwargs.pop("n_seq_max"))
        self._seq_ctx = int(kwargs.pop("n_ctx"))
        self._n_batch = int(kwargs.pop("n_batch", 512))
        super().__init__(model_path, embedding=False, engine_kwargs={**kwargs, "n_ctx": _TOKENIZER_CTX})
        # Request threads only wait on their sequence; the scheduler thread does the work.
        self._executor = ThreadPoolExecutor(max_workers=4 * self._n_seq + 2, thread_name_prefix="llama-req")
        self._incoming: queue.SimpleQueue[_Sequence] = queue.SimpleQueue()
        self._ctx: Any = None

    async def start(self) -> None:
        await super().start()
        import llama_cpp
        from llama_cpp import _internals

        # `Llama`'s own context settings (flash attention, rope, KV types...), so the numbers,
        # and with them greedy outputs, match the one-sequence engine; only the shape differs.
        params = llama_cpp.llama_context_params.from_buffer_copy(self._llm.context_params)
        params.n_ctx = self._seq_ctx * self._n_seq
        params.n_seq_max = self._n_seq
        params.n_batch = params.n_ubatch = self._n_batch
        params.kv_unified = False  # each sequence its own n_ctx cells: none can starve another
        self._ctx = _internals.LlamaContext(model=self._llm._model, params=params, verbose=False)
        threading.Thread(target=self._schedule, name="llama-batch", daemon=True).start()

    @property
    def context_length(self) -> int:
        return self._seq_ctx

    def _decode_tokens(
        self,
        request: GenerateRequest,
        prompt: list[int],
        budget: int,
        sampler: Any,
        cancel: threading.Event,
        emit: Any,
    ) -> None:
        """Runs on a request thread: hand the sequence to the scheduler, wait for its end.

        `sampler` stays the caller's to close (`_decode`); the scheduler stops using it before
        it lets this thread go."""
        out = SequenceOutput(self._llm, request, len(prompt), budget, emit, self._stats)
        seq = _Sequence(prompt, sampler, out, cancel, prompt_top=request.sampling.prompt_logprobs)
        self._incoming.put(seq)
        seq.done.wait()
        if seq.error is not None:
            raise seq.error

    # -- the scheduler thread --------------------------------------------------------------

    def _schedule(self) -> None:
        from llama_cpp import _internals

        batch = _internals.LlamaBatch(n_tokens=self._n_batch, embd=0, n_seq_max=1, verbose=False)
        cached: list[list[int]] = [[] for _ in range(self._n_seq)]
        running: dict[int, _Sequence] = {}
        while True:
            self._admit(running, cached)
            for slot, seq in list(running.items()):
                if seq.cancel.is_set():
                    self._finish(seq, "abort")
                    del running[slot]
            if not running:
                continue
            try:
                outputs, scored = self._fill(batch, running, cached)
                self._decode_batch(batch)
            except Exception as exc:  # noqa: BLE001 - fail what runs, keep serving: strand no request
                for slot, seq in running.items():
                    cached[slot] = []
                    self._llama.llama_memory_seq_rm(self._ctx.memory, slot, -1, -1)
                    self._fail(seq, exc)
                running.clear()
                continue
            for slot, first_row, start, n in scored:
                if not self._score_prompt(running[slot], first_row, start, n):
                    del running[slot]
            for slot, row in outputs:
                if slot in running and self._step(running[slot], row):
                    del running[slot]

    def _step(self, seq: _Sequence, row: int) -> bool:
        """Sample this sequence's next token from its own row of the batch's logits. A failure
        here (a grammar that allows nothing, say) ends this sequence only."""
        try:
            token = seq.sampler.sample(self._ctx.ctx, row)
            ended = seq.out.push(token, self._ctx.ctx, row)
        except Exception as exc:  # noqa: BLE001 - reported to the request, not to the scheduler
            self._fail(seq, exc)
            return True
        if ended:
            self._release(seq)
        else:
            seq.next_token = token
        return ended

    def _score_prompt(self, seq: _Sequence, first_row: int, start: int, n: int) -> bool:
        """Score a prompt chunk just decoded (rows `first_row ..`). Returns False if it failed,
        which ends this sequence only."""
        assert seq.prompt_top is not None
        llm, ctx = self._llm, self._ctx.ctx
        try:
            if start == 0:
                seq.prompt_scores.append(sampling_lib.unpredicted(llm, seq.prompt[0]))
            seq.prompt_scores += sampling_lib.score_prompt_chunk(
                llm, ctx, seq.prompt, start, first_row, n, seq.prompt_top
            )
        except Exception as exc:  # noqa: BLE001 - reported to the request, not to the scheduler
            self._fail(seq, exc)
            return False
        if start + n == len(seq.prompt):  # complete: it goes out with the first delta
            seq.out.builder.prompt_logprobs = seq.prompt_scores
        return True

    @property
    def _llama(self) -> Any:
        import llama_cpp

        return llama_cpp

    def _admit(self, running: dict[int, _Sequence], cached: list[list[int]]) -> None:
        """Take waiting sequences into free slots; block only when nothing runs."""
        while len(running) < self._n_seq:
            try:
                seq = self._incoming.get(block=not running)
            except queue.Empty:
                return
            if seq.cancel.is_set():
                self._finish(seq, "abort")
                continue
            free = [s for s in range(self._n_seq) if s not in running]
            slot = max(free, key=lambda s: _common_prefix(cached[s], seq.prompt))
            # Prompt logprobs need every position's logits: nothing cached can be reused.
            shared = 0 if seq.prompt_top is not None else _common_prefix(cached[slot], seq.prompt)
            keep = min(shared, len(seq.prompt) - sampling_lib.REEVALUATED)
            self._llama.llama_memory_seq_rm(self._ctx.memory, slot, keep, -1)
            del cached[slot][keep:]
            seq.slot, seq.fed = slot, keep
            running[slot] = seq

    def _fill(
        self, batch: Any, running: dict[int, _Sequence], cached: list[list[int]]
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
        """One decode's tokens: every running sequence's next token first, then prompt chunks.
        Returns (slot, batch index) of each token whose logits are sampled, and
        (slot, first batch index, first prompt position, count) of each prompt chunk whose
        tokens are scored (prompt logprobs)."""
        b = batch.batch
        b.n_tokens = 0
        outputs: list[tuple[int, int]] = []
        scored: list[tuple[int, int, int, int]] = []

        def add(slot: int, token: int, logits: bool) -> None:
            i = b.n_tokens
            b.token[i], b.pos[i], b.n_seq_id[i] = token, len(cached[slot]), 1
            b.seq_id[i][0], b.logits[i] = slot, logits
            b.n_tokens = i + 1
            cached[slot].append(token)

        for slot, seq in running.items():
            if seq.next_token is not None:
                outputs.append((slot, b.n_tokens))
                add(slot, seq.next_token, True)
                seq.next_token = None
        for slot, seq in running.items():
            room = self._n_batch - b.n_tokens
            todo = len(seq.prompt) - seq.fed
            if todo <= 0 or room <= 0:
                continue
            take = min(todo, room)
            every = seq.prompt_top is not None
            if every:
                scored.append((slot, b.n_tokens, seq.fed, take))
            for k, token in enumerate(seq.prompt[seq.fed : seq.fed + take]):
                last = seq.fed + k == len(seq.prompt) - 1
                if last:
                    outputs.append((slot, b.n_tokens))
                add(slot, token, every or last)
            seq.fed += take
        return outputs, scored

    def _decode_batch(self, batch: Any) -> None:
        rc = self._llama.llama_decode(self._ctx.ctx, batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _finish(self, seq: _Sequence, reason: FinishReason) -> None:
        seq.out.finish(reason)
        self._release(seq)

    def _fail(self, seq: _Sequence, exc: BaseException) -> None:
        seq.error = exc  # `_decode` reports it as an EngineError on the request's stream
        self._release(seq)

    @staticmethod
    def _release(seq: _Sequence) -> None:
        """The scheduler is done with `seq`: its request thread may return (and close the sampler)."""
        seq.done.set()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
