"""What the batched llama.cpp engine's scheduler holds per request, and how one decode's batch
is built from the running ones (`fill`).

Why a module of its own: the batch's composition is where llama.cpp's rules for a KV stream per
sequence meet the scheduler's (next tokens before prompt chunks, slot order), and it is testable
without a model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from raygate.backends.engines.llama_cpp import sampling as sampling_lib
from raygate.backends.engines.llama_cpp.lora import LoraKey
from raygate.backends.engines.llama_cpp.sequence import SequenceOutput
from raygate.backends.engines.llama_cpp.vision import ImageSpan, next_span
from raygate.backends.streams import ThreadFeed
from raygate.protocol.generation import Delta, TokenLogprob


@dataclass(eq=False)
class RunningSequence:
    """One request inside the scheduler."""

    prompt: list[int]
    sampler: sampling_lib.TokenSampler
    out: SequenceOutput
    feed: ThreadFeed[Delta]
    # Completions `echo` + `logprobs`: score every prompt token, with this many alternatives.
    prompt_top: int | None = None
    prompt_scores: list[TokenLogprob] = field(default_factory=list)
    slot: int = -1
    fed: int = 0  # prompt tokens already in the KV cache
    next_token: int | None = None  # sampled, not yet fed back
    first: bool = True  # nothing sampled yet: the next logits row is the prompt's last position
    lora: LoraKey = ()  # the LoRA adapter set it decodes under (lora.py); () the base model
    holds_lora: bool = False  # acquired `lora` (its adapters are loaded and counted as in use)
    # Its prompt's images (vision.py): the pseudo ids of `prompt` at these spans are evaluated by
    # the projector, not fed as tokens.
    images: tuple[ImageSpan, ...] = ()

    def image_at_fed(self) -> ImageSpan | None:
        """The image span the prompt has reached, if its next position begins one."""
        span = next_span(self.images, self.fed) if self.images else None
        return span if span is not None and span.start == self.fed else None

    @property
    def cancel(self) -> threading.Event:
        """Set by `abort()` or when the request's stream is closed."""
        return self.feed.cancel


def fill(
    batch: Any, running: dict[int, RunningSequence], cached: list[list[int]], n_batch: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
    """One decode's tokens: the next token of every running sequence whose reader keeps up
    (a paused one keeps its token for later), and prompt chunks in the room left.
    The tokens go in slot order: llama.cpp splits a batch over per-sequence KV streams into
    micro-batches of consecutive sequence ids only (`split_equal`, sequential), each one a
    pass over all the weights. In admission order, which slot reuse soon scrambles, the eight
    next tokens of a full batch took several passes: 40-70 % more compute per decode,
    measured. A prompt's first token then rides in the decode's micro-batch.
    A prompt's text stops at its next image span (`RunningSequence.images`), which the
    scheduler evaluates through the projector before the next fill.
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

    def decodes(seq: RunningSequence) -> bool:
        prompt_done = seq.fed >= len(seq.prompt)  # a drawn first token waits for its prompt
        return seq.next_token is not None and prompt_done and not seq.feed.full

    order = sorted(running)
    stepping = {slot for slot in order if decodes(running[slot])}
    room = n_batch - len(stepping)  # for prompt tokens, after every next token
    for slot in order:
        seq = running[slot]
        if slot in stepping:
            assert seq.next_token is not None
            outputs.append((slot, b.n_tokens))
            add(slot, seq.next_token, True)
            seq.next_token = None
            continue
        take = min(len(seq.prompt) - seq.fed, room)
        image = next_span(seq.images, seq.fed) if seq.images else None
        if image is not None:  # text up to the image; the scheduler evaluates the image itself
            take = min(take, image.start - seq.fed)
        if take <= 0:
            continue
        room -= take
        every = seq.prompt_top is not None
        if every:
            scored.append((slot, b.n_tokens, seq.fed, take))
        for k, token in enumerate(seq.prompt[seq.fed : seq.fed + take]):
            last = seq.fed + k == len(seq.prompt) - 1 and seq.first
            if last:
                outputs.append((slot, b.n_tokens))
            add(slot, token, every or last)
        seq.fed += take
    return outputs, scored
