"""What the batched llama.cpp engine's scheduler holds per request, and how one decode's batch
is built from the running ones (`fill`).

Why a module of its own: the batch's composition is where llama.cpp's rules for a KV stream per
sequence meet the scheduler's (next tokens before prompt chunks, slot order), and it is testable
without a model.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raygate.backends.engines.llama_cpp import sampling as sampling_lib
from raygate.backends.engines.llama_cpp.lora import LoraKey
from raygate.backends.engines.llama_cpp.prompt_store import common_prefix
from raygate.backends.engines.llama_cpp.sequence import SequenceOutput
from raygate.backends.engines.llama_cpp.vision import ImageSpan, next_span
from raygate.backends.streams import ThreadFeed
from raygate.protocol.generation import Delta, TokenLogprob

# While an interactive request runs, batch lines' prompts go in at most this many tokens per decode
# (all lines together). A decode carrying a whole batch prompt is one an arriving interactive
# request waits for before its own prompt is fed, and one its streams see as a long gap between
# tokens; in chunks a batch prompt rides along many short decodes instead (llama.cpp's pass over
# the weights is paid by the interactive tokens anyway), at the cost of its own first token coming
# a few decodes later. 16: issue 48's bench row (`python -m bench --only batches`).
BATCH_PROMPT_CHUNK = 16
# For this long after an interactive sequence ends, decodes carry no batch line: its client's next
# request (a chat turn, an agent's next step, a closed loop) is likely on its way, and arrives
# while a decode runs. A decode of the interactive tokens alone is over sooner, so it waits
# less: in issue 48's bench row it waited a whole decode of 2 interactive and 2 batch tokens,
# 40 ms at the median against 10 ms with no batch running, which was all of its time to first
# token's rise (measured per request in the engine). Covers a client on the same host or LAN.
INTERACTIVE_RETURN_S = 0.025


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
    # The request's scheduling class (`GenerateRequest.rank`: batch line, then `priority`) and its
    # arrival: waiting sequences are admitted, and prompt chunks get a decode's room, in this order.
    rank: tuple[bool, int] = (False, 0)
    order: int = 0
    # Preempted once (its slot went to a sequence of a better class): its `prompt` is then every
    # token its cells held, fed again (or restored from the host store) before it decodes on.
    resumed: bool = False
    # A running sequence whose evaluated prompt shares this many tokens with this one's, more than
    # any slot or stored state holds: this one feeds nothing until those tokens are in the other's
    # slot, then takes a copy of them (`donor`, `BatchedLlamaCppEngine._follow`).
    follows: tuple[RunningSequence, int] | None = None
    # As a donor: feed no further than this until the sequences following it have their copies, so
    # that they and it finish their prompts in the same decode (set by the scheduler every step).
    hold: int = 0
    # Its prompt's last logits, its first token not yet drawn: held while the prompts that arrived
    # with it are still being fed (`holds_first`).
    first_logits: np.ndarray | None = None
    # When it was handed to the scheduler (time.time): its first placement reports the wait.
    arrived: float = field(default_factory=time.time)

    def queue_key(self) -> tuple[tuple[bool, int], int]:
        return (self.rank, self.order)

    @property
    def preemptable(self) -> bool:
        """Its progress is all in its tokens: no prompt scores and no image spans to evaluate again."""
        return self.prompt_top is None and not self.images

    def image_at_fed(self) -> ImageSpan | None:
        """The image span the prompt has reached, if its next position begins one."""
        span = next_span(self.images, self.fed) if self.images else None
        return span if span is not None and span.start == self.fed else None

    @property
    def cancel(self) -> threading.Event:
        """Set by `abort()` or when the request's stream is closed."""
        return self.feed.cancel


def fill(
    batch: Any,
    running: dict[int, RunningSequence],
    cached: list[list[int]],
    n_batch: int,
    *,
    batch_yields: bool = False,
) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
    """One decode's tokens: the next token of every running sequence whose reader keeps up
    (a paused one keeps its token for later), and prompt chunks in the room left.
    The tokens go in slot order: llama.cpp splits a batch over per-sequence KV streams into
    micro-batches of consecutive sequence ids only (`split_equal`, sequential), each one a
    pass over all the weights. In admission order, which slot reuse soon scrambles, the eight
    next tokens of a full batch took several passes: 40-70 % more compute per decode,
    measured. A prompt's first token then rides in the decode's micro-batch.
    A prompt's text stops at its next image span (`RunningSequence.images`), which the
    scheduler evaluates through the projector before the next fill. Prompt chunks share the room
    by class (`_prompt_takes`): a batch line's prompt waits while an interactive one is fed, and so
    does a batch line's next token: the decodes that prefill an interactive prompt carry no batch
    line, so its time to first token is the one it has with no batch running. While interactive
    requests run, batch prompts go in chunks of `BATCH_PROMPT_CHUNK` tokens. `batch_yields`: no
    batch line rides in this decode at all (`INTERACTIVE_RETURN_S`).
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
    if batch_yields or _interactive_prefill(running, stepping):
        # Batch lines sit this decode out (keeping their sampled tokens): it carries an interactive
        # prompt, whose first token then costs what it costs with no batch running, or it may be
        # the one a returning interactive request waits for.
        stepping = {slot for slot in stepping if not running[slot].rank[0]}
    # The room after every next token.
    takes = _prompt_takes(running, stepping, n_batch - len(stepping), batch_yields)
    for slot in order:
        seq = running[slot]
        if slot in stepping:
            assert seq.next_token is not None
            outputs.append((slot, b.n_tokens))
            add(slot, seq.next_token, True)
            seq.next_token = None
            continue
        take = takes.get(slot, 0)
        if take <= 0:
            continue
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


def _interactive_prefill(running: dict[int, RunningSequence], stepping: set[int]) -> bool:
    """Whether an interactive sequence has prompt tokens to feed in this decode."""
    return any(
        not seq.rank[0] and slot not in stepping and seq.fed < len(seq.prompt)
        for slot, seq in running.items()
    )


def _prompt_takes(
    running: dict[int, RunningSequence], stepping: set[int], room: int, batch_yields: bool
) -> dict[int, int]:
    """Prompt tokens each sequence feeds in this decode. The room goes by class (`priority`) first;
    while an interactive prompt is being fed no batch line's prompt is (its chunk would lengthen
    the decode that produces the interactive request's first token), nor while `batch_yields`.
    Interactive prompts of one class share the room evenly (`_shared`), so prompts that arrived
    together get their first tokens in the same decode: fed first come first served, the first
    prompt's stream would wait through every later prompt's chunks between its first tokens
    (a gap of a whole decode per chunk, measured 1.0-1.8 s at c=8 on 2 cores), and the streams
    would stay out of step for good, each next request's prompt stalling all the others. Batch
    lines go by arrival (their first tokens are nobody's wait)."""
    feeding = sorted(
        (
            slot
            for slot, seq in running.items()
            if slot not in stepping and seq.fed < len(seq.prompt) and not (batch_yields and seq.rank[0])
        ),
        key=lambda slot: (running[slot].queue_key(), slot),
    )
    interactive = any(not running[slot].rank[0] for slot in feeding)
    batch_room = BATCH_PROMPT_CHUNK if any(not seq.rank[0] for seq in running.values()) else room
    takes: dict[int, int] = {}
    for rank, group in itertools.groupby(feeding, key=lambda slot: running[slot].rank):
        slots = list(group)
        if rank[0]:
            if interactive:
                break  # sorted: every later one is a batch line too
            for slot in slots:
                take = min(_wants(running[slot]), room, batch_room)
                if take > 0:
                    takes[slot] = take
                    room -= take
                    batch_room -= take
            continue
        for slot, take in zip(slots, _shared([_wants(running[s]) for s in slots], room), strict=True):
            if take > 0:
                takes[slot] = take
                room -= take
    return takes


def _wants(seq: RunningSequence) -> int:
    """The prompt tokens `seq` could feed in one decode: the rest of its prompt, up to its next
    image (the scheduler evaluates the image itself); none while it waits to copy another's."""
    if seq.follows is not None:
        return 0
    image = next_span(seq.images, seq.fed) if seq.images else None
    end = image.start if image is not None else len(seq.prompt)
    if seq.hold > seq.fed:
        end = min(end, seq.hold)
    return max(0, end - seq.fed)


def _shared(wants: list[int], room: int) -> list[int]:
    """`room` split evenly over `wants` (max-min fair): what one does not need goes to the others."""
    takes = [0] * len(wants)
    left = len(wants)
    for i in sorted(range(len(wants)), key=wants.__getitem__):
        takes[i] = min(wants[i], room if left == 1 else room // left)
        room -= takes[i]
        left -= 1
    return takes


def holds_first(seq: RunningSequence, running: dict[int, RunningSequence]) -> bool:
    """Whether `seq`, its prompt just evaluated, waits to draw its first token: while no
    interactive stream has started and other interactive prompts are still being fed, as
    when requests sent together arrive over a decode or two, or one follows another's prefix.
    Drawn at once, its stream would wait through each of their prompt decodes (a gap of a
    second or more each, on 2 cores) and end that many tokens ahead of them, out of step for
    good; held, every first token comes out together, as llama-server's one decode of all
    the waiting prompts gives them."""
    if seq.rank[0] or not seq.first:
        return False
    others = [q for q in running.values() if q is not seq and not q.rank[0]]
    streaming = any(not q.first for q in others)
    feeding = any(q.fed < len(q.prompt) or q.follows is not None for q in others)
    return feeding and not streaming


def donor(
    seq: RunningSequence, running: dict[int, RunningSequence], keep: int, last: int, least: int
) -> tuple[RunningSequence, int] | None:
    """The running sequence whose prompt shares the most with `seq`'s, if that is
    `least` tokens more than `seq`'s slot holds: prompts that open alike and arrive
    together (one system prompt, one document, many questions) are then evaluated once, as the
    slots and the host store serve prompts that arrive one after another. At most `last`:
    the tokens `seq` evaluates itself for its first logits."""
    best: tuple[RunningSequence, int] | None = None
    floor = keep + least
    for other in running.values():
        if other.lora != seq.lora or other.images:
            continue
        n = min(common_prefix(other.prompt, seq.prompt), last)
        if other.rank[0] and not seq.rank[0] and other.fed < n:
            continue  # a batch line's prompt goes in small chunks while this one would wait
        if n > floor:
            best, floor = (other, n), n
    return best
