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

Everything per request is `LlamaCppEngine`'s: prompt and chat template, the context-length check,
sampling (the same sampler chain), stop strings, UTF-8 reassembly, the cancel flag (checked before
every decode) and the deltas. Only the decode loop moves from one thread per request to the shared
scheduler; a request's executor thread just waits for its sequence to end.
"""

from __future__ import annotations

import queue
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from backends.capabilities import refuse_advanced
from backends.llama_cpp_engine import DEFAULT_ENGINE_KWARGS, LlamaCppEngine
from backends.text_stream import StopMatcher, Utf8Stream
from protocol.errors import EngineError
from protocol.generation import Delta, FinishReason, GenerateRequest, SamplingParams

# The `Llama` object is kept for the tokenizer and chat template only; its own context stays tiny.
_TOKENIZER_CTX = 64
# `Llama`'s default penalty window, so penalties mean the same as in the one-sequence engine.
_PENALTY_LAST_N = 64


@dataclass(eq=False)
class _Sequence:
    """One request inside the scheduler."""

    prompt: list[int]
    budget: int
    sampling: SamplingParams
    cancel: threading.Event
    emit: Any
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    slot: int = -1
    fed: int = 0  # prompt tokens already in the KV cache
    next_token: int | None = None  # sampled, not yet fed back
    n_out: int = 0
    sampler: Any = None
    utf8: Utf8Stream = field(default_factory=Utf8Stream)
    stops: StopMatcher | None = None


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

        The scheduler samples with its own plain chain (`_sampler`), so what needs the
        one-sequence engine's sampler (`sampler`, closed by the caller) is refused, not dropped."""
        sampling = request.sampling
        refuse_advanced(request, "llama_cpp (batched, n_seq_max > 1)")
        seq = _Sequence(prompt, budget, sampling, cancel, emit, stops=StopMatcher(sampling.stop))
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
                outputs = self._fill(batch, running, cached)
                self._decode_batch(batch)
                for slot, index in outputs:
                    seq = running[slot]
                    if self._on_token(seq, seq.sampler.sample(self._ctx, index)):
                        del running[slot]
            except Exception as exc:  # noqa: BLE001 - fail what runs, keep serving: strand no request
                for slot, seq in running.items():
                    cached[slot] = []
                    self._llama.llama_memory_seq_rm(self._ctx.memory, slot, -1, -1)
                    seq.error = EngineError(f"llama.cpp failed: {exc}")
                    self._release(seq)
                running.clear()

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
            keep = min(_common_prefix(cached[slot], seq.prompt), len(seq.prompt) - 1)
            self._llama.llama_memory_seq_rm(self._ctx.memory, slot, keep, -1)
            del cached[slot][keep:]
            seq.slot, seq.fed, seq.sampler = slot, keep, self._sampler(seq.sampling)
            running[slot] = seq

    def _fill(
        self, batch: Any, running: dict[int, _Sequence], cached: list[list[int]]
    ) -> list[tuple[int, int]]:
        """One decode's tokens: every running sequence's next token first, then prompt chunks.
        Returns (slot, batch index) of each token whose logits are sampled."""
        b = batch.batch
        b.n_tokens = 0
        outputs: list[tuple[int, int]] = []

        def add(slot: int, token: int, logits: bool) -> None:
            i = b.n_tokens
            b.token[i], b.pos[i], b.n_seq_id[i] = token, len(cached[slot]), 1
            b.seq_id[i][0], b.logits[i] = slot, logits
            b.n_tokens = i + 1
            cached[slot].append(token)
            if logits:
                outputs.append((slot, i))

        for slot, seq in running.items():
            if seq.next_token is not None:
                add(slot, seq.next_token, True)
                seq.next_token = None
        for slot, seq in running.items():
            room = self._n_batch - b.n_tokens
            todo = len(seq.prompt) - seq.fed
            if todo <= 0 or room <= 0:
                continue
            take = min(todo, room)
            for k, token in enumerate(seq.prompt[seq.fed : seq.fed + take]):
                add(slot, token, seq.fed + k == len(seq.prompt) - 1)
            seq.fed += take
        return outputs

    def _decode_batch(self, batch: Any) -> None:
        rc = self._llama.llama_decode(self._ctx.ctx, batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _sampler(self, sampling: SamplingParams) -> Any:
        """The chain `Llama._init_sampler` builds for the arguments `LlamaCppEngine` passes."""
        from llama_cpp import _internals

        s = _internals.LlamaSampler()
        s.add_penalties(
            self._llm.n_vocab(), _PENALTY_LAST_N, 1.0, sampling.frequency_penalty, sampling.presence_penalty
        )
        if sampling.temperature == 0.0:
            s.add_greedy()
        else:
            s.add_top_k(0)
            s.add_typical(1.0, 1)
            s.add_top_p(sampling.top_p, 1)
            s.add_min_p(0.0, 1)
            s.add_temp(sampling.temperature)
            s.add_dist(sampling.seed if sampling.seed is not None else random.getrandbits(32))
        return s

    def _on_token(self, seq: _Sequence, token: int) -> bool:
        """The per-token rules of `LlamaCppEngine._decode_tokens`. Returns whether it ended."""
        assert seq.stops is not None
        n_prompt = len(seq.prompt)
        if self._llama.llama_vocab_is_eog(self._llm._model.vocab, token):
            self._finish(seq, "stop")
            return True
        seq.n_out += 1
        self._stats.tokens_generated_total += 1
        text, stopped = seq.stops.push(seq.utf8.push(self._llm.detokenize([token])))
        if stopped:
            seq.emit(Delta(text, seq.n_out, n_prompt, "stop"))
            self._release(seq)
            return True
        if seq.n_out >= seq.budget:
            seq.emit(Delta(text + seq.stops.flush() + seq.utf8.flush(), seq.n_out, n_prompt, "length"))
            self._release(seq)
            return True
        if text:
            seq.emit(Delta(text, seq.n_out, n_prompt))
        seq.next_token = token
        return False

    def _finish(self, seq: _Sequence, reason: FinishReason) -> None:
        assert seq.stops is not None
        tail, _ = seq.stops.push(seq.utf8.flush())
        seq.emit(Delta(tail + seq.stops.flush(), seq.n_out, len(seq.prompt), reason))
        self._release(seq)

    @staticmethod
    def _release(seq: _Sequence) -> None:
        if seq.sampler is not None:
            seq.sampler.close()
            seq.sampler = None
        seq.done.set()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
