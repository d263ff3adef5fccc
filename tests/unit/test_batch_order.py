"""The batched llama.cpp engine's decode batch (`decode_batch.fill`), without a model: slot order.

llama.cpp splits a batch over per-sequence KV streams into micro-batches of consecutive sequence
ids only, each a pass over all the weights, so a batch in admission order (slots 5, 0, 3, ...)
costs several passes where slot order costs one (measured: 40-70 % more compute per decode).
"""

from __future__ import annotations

from types import SimpleNamespace

from llama_cpp import _internals

from raygate.backends.engines.llama_cpp.decode_batch import BATCH_PROMPT_CHUNK, RunningSequence, fill


def sequence(prompt: list[int], fed: int, next_token: int | None) -> RunningSequence:
    """Only what `fill` reads: the prompt, how much of it is fed, the token drawn, the feed's room."""
    seq = RunningSequence(prompt, sampler=None, out=None, feed=SimpleNamespace(full=False))  # type: ignore[arg-type]
    seq.fed, seq.next_token, seq.first = fed, next_token, next_token is None
    return seq


def test_next_tokens_and_prompt_chunks_go_in_slot_order() -> None:
    batch = _internals.LlamaBatch(n_tokens=16, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[1], [], [1], [], [1, 2], [], [7], []]
    # Admitted 4, 6, 1, 0, 2: slot 1 still feeds its prompt, the others decode.
    running = {
        4: sequence([1, 2], fed=2, next_token=40),
        6: sequence([7], fed=1, next_token=60),
        1: sequence([8, 8, 8], fed=0, next_token=None),
        0: sequence([1], fed=1, next_token=0),
        2: sequence([1], fed=1, next_token=20),
    }
    outputs, scored = fill(batch, running, cached, n_batch=16)
    b = batch.batch
    seq_ids = [b.seq_id[i][0] for i in range(b.n_tokens)]
    assert seq_ids == [0, 1, 1, 1, 2, 4, 6]
    assert [b.token[i] for i in range(b.n_tokens)] == [0, 8, 8, 8, 20, 40, 60]
    # Logits for every next token, and for the last prompt token of slot 1 (its first draw).
    assert outputs == [(0, 0), (1, 3), (2, 4), (4, 5), (6, 6)]
    assert [bool(b.logits[i]) for i in range(b.n_tokens)] == [True, False, False, True, True, True, True]
    assert scored == [] and running[1].fed == 3


def test_prompt_chunks_fill_only_the_room_the_next_tokens_leave() -> None:
    batch = _internals.LlamaBatch(n_tokens=4, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[], [5], [], [6]]
    running = {
        0: sequence([9] * 10, fed=0, next_token=None),
        1: sequence([5], fed=1, next_token=50),
        3: sequence([6], fed=1, next_token=60),
    }
    fill(batch, running, cached, n_batch=4)
    b = batch.batch
    # Both next tokens, and two of slot 0's ten prompt tokens, ahead of them by slot.
    assert [b.seq_id[i][0] for i in range(b.n_tokens)] == [0, 0, 1, 3]
    assert running[0].fed == 2


def test_an_interactive_prompt_takes_the_room_first_and_batch_prompts_wait_for_it() -> None:
    """Prompt chunks share a decode's room by class: the interactive prompt (in a later slot,
    arrived later) is fed first, and no batch line rides in the decode that gives the
    interactive request its first token, neither a prompt chunk nor a next token (it keeps its
    token for the next decode); an interactive next token does."""
    batch = _internals.LlamaBatch(n_tokens=8, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[], [4], [], []]
    line = sequence([9] * 6, fed=0, next_token=None)
    line.rank, line.order = (True, 0), 0
    decoding = sequence([4], fed=1, next_token=40)
    decoding.rank = (True, 0)
    interactive = sequence([7] * 5, fed=0, next_token=None)
    interactive.order = 2
    other = sequence([5], fed=1, next_token=50)  # an interactive request already decoding
    cached.append([5])
    running = {0: line, 1: decoding, 3: interactive, 4: other}
    outputs, _ = fill(batch, running, cached, n_batch=8)
    b = batch.batch
    assert [b.seq_id[i][0] for i in range(b.n_tokens)] == [3, 3, 3, 3, 3, 4]
    assert (line.fed, interactive.fed) == (0, 5) and decoding.next_token == 40
    assert [slot for slot, _ in outputs] == [3, 4]
    # Once the interactive prompt is in, the batch lines decode again: the held token, the prompt.
    interactive.next_token, other.next_token = 70, 51
    fill(batch, running, cached, n_batch=8)
    assert [b.seq_id[i][0] for i in range(b.n_tokens)] == [0] * 5 + [1, 3, 4]
    assert line.fed == 5 and decoding.next_token is None and cached[1] == [4, 40]


def test_batch_prompts_share_the_room_by_priority_then_arrival() -> None:
    batch = _internals.LlamaBatch(n_tokens=4, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[], [], []]
    late = sequence([1] * 4, fed=0, next_token=None)
    late.rank, late.order = (True, 0), 5
    early = sequence([2] * 4, fed=0, next_token=None)
    early.rank, early.order = (True, 0), 1
    urgent = sequence([3] * 2, fed=0, next_token=None)
    urgent.rank, urgent.order = (True, -1), 9
    fill(batch, {0: late, 1: early, 2: urgent}, cached, n_batch=4)
    assert (urgent.fed, early.fed, late.fed) == (2, 2, 0)


def test_batch_prompts_go_in_chunks_while_interactive_requests_run() -> None:
    """A long batch prompt would make the decode carrying it long, and an interactive request that
    arrives meanwhile waits for that decode: while one runs, batch prompts go in chunks of
    `BATCH_PROMPT_CHUNK` (all lines together); with none running, a batch prompt takes the room."""
    batch = _internals.LlamaBatch(n_tokens=64, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[], [], [5]]
    first = sequence([1] * 40, fed=0, next_token=None)
    first.rank, first.order = (True, 0), 0
    second = sequence([2] * 40, fed=0, next_token=None)
    second.rank, second.order = (True, 0), 1
    interactive = sequence([5], fed=1, next_token=50)  # decoding
    running = {0: first, 1: second, 2: interactive}
    fill(batch, running, cached, n_batch=64)
    assert (first.fed, second.fed) == (BATCH_PROMPT_CHUNK, 0)
    assert batch.batch.n_tokens == BATCH_PROMPT_CHUNK + 1  # and the interactive next token
    del running[2]  # the interactive request ended: the lines take the room again
    fill(batch, running, cached, n_batch=64)
    assert (first.fed, second.fed) == (40, 40)


def test_batch_lines_sit_out_while_they_yield_to_a_returning_request() -> None:
    """Right after an interactive sequence ends (`INTERACTIVE_RETURN_S`), no batch line rides in a
    decode, neither a next token nor a prompt chunk, so its client's next request waits for a
    short decode; each line keeps its token and its place in its prompt."""
    batch = _internals.LlamaBatch(n_tokens=64, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[4], [], [5]]
    decoding = sequence([4], fed=1, next_token=40)
    decoding.rank = (True, 0)
    prompt = sequence([2] * 8, fed=0, next_token=None)
    prompt.rank = (True, 0)
    interactive = sequence([5], fed=1, next_token=50)
    running = {0: decoding, 1: prompt, 2: interactive}
    outputs, _ = fill(batch, running, cached, n_batch=64, batch_yields=True)
    assert [batch.batch.seq_id[i][0] for i in range(batch.batch.n_tokens)] == [2]
    assert outputs == [(2, 0)] and decoding.next_token == 40 and prompt.fed == 0
    del running[2]  # only batch lines: the decode is empty while they yield
    fill(batch, running, cached, n_batch=64, batch_yields=True)
    assert batch.batch.n_tokens == 0
    fill(batch, running, cached, n_batch=64)
    assert [batch.batch.seq_id[i][0] for i in range(batch.batch.n_tokens)] == [0] + [1] * 8


def test_interactive_prompts_arriving_together_share_the_room_and_finish_together() -> None:
    """Fed first come first served, the first prompt would draw its first token and then wait
    through the others' chunks; shared evenly, prompts of one class are all in by the same decode
    (a shorter one gives what it does not need to the longer ones)."""
    batch = _internals.LlamaBatch(n_tokens=12, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[], [], []]
    running = {0: sequence([1] * 8, 0, None), 1: sequence([2] * 8, 0, None), 2: sequence([3] * 2, 0, None)}
    outputs, _ = fill(batch, running, cached, n_batch=12)
    assert [running[s].fed for s in range(3)] == [5, 5, 2] and outputs == [(2, 11)]
    outputs, _ = fill(batch, running, cached, n_batch=12)
    assert [running[s].fed for s in range(3)] == [8, 8, 2]
    assert sorted(slot for slot, _ in outputs) == [0, 1]


def test_a_better_class_is_fed_before_the_room_is_shared_with_a_worse_one() -> None:
    batch = _internals.LlamaBatch(n_tokens=6, embd=0, n_seq_max=1, verbose=False)
    cached: list[list[int]] = [[], [], []]
    urgent = sequence([1] * 4, 0, None)
    urgent.rank = (False, -1)
    running = {0: sequence([2] * 6, 0, None), 1: sequence([3] * 6, 0, None), 2: urgent}
    fill(batch, running, cached, n_batch=6)
    assert (urgent.fed, running[0].fed, running[1].fed) == (4, 1, 1)
