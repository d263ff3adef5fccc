"""The batched llama.cpp engine gathers the requests that arrive with the one waking it
(`BatchedLlamaCppEngine._gather`), without a model: its scheduler's queues only."""

from __future__ import annotations

from concurrent.futures import Future

from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
from raygate.backends.engines.llama_cpp.decode_batch import holds_first
from tests.unit.test_batch_order import sequence


def test_an_idle_engine_takes_every_request_that_arrived_with_the_first_and_runs_commands_meanwhile() -> None:
    engine = BatchedLlamaCppEngine("never-loaded.gguf", engine_kwargs={"n_ctx": 64, "n_seq_max": 4})
    seqs = [sequence([i] * 4, 0, None) for i in range(3)]
    ran: list[str] = []
    done: Future[None] = Future()
    engine._incoming.put(seqs[0])
    engine._commands.put((lambda: ran.append("command"), done))
    engine._incoming.put(None)  # what `_on_scheduler` puts to wake the scheduler
    engine._incoming.put(seqs[1])
    engine._incoming.put(seqs[2])
    engine._take_incoming({})
    assert engine._pending == seqs and [s.order for s in seqs] == [0, 1, 2]
    assert ran == ["command"] and done.done()
    assert engine._incoming.empty()


def test_a_busy_engine_takes_only_what_has_arrived() -> None:
    engine = BatchedLlamaCppEngine("never-loaded.gguf", engine_kwargs={"n_ctx": 64, "n_seq_max": 4})
    running = {0: sequence([9], 1, 90)}
    engine._incoming.put(first := sequence([1] * 4, 0, None))
    engine._slots.cached[0], engine._slots.used[0] = [9], 1
    engine._take_incoming(running)
    assert engine._pending == [first]


def test_a_first_token_waits_for_the_prompts_fed_with_it_only_while_no_stream_runs() -> None:
    hold = holds_first
    done, feeding = sequence([1] * 4, 4, None), sequence([2] * 8, 3, None)
    assert hold(done, {0: done, 1: feeding})  # its stream would wait through `feeding`'s prompt
    streaming = sequence([3], 1, 30)
    streaming.first = False
    assert not hold(done, {0: done, 1: feeding, 2: streaming})  # streams run: nothing to keep in step
    line = sequence([4] * 8, 0, None)
    line.rank = (True, 0)
    assert not hold(done, {0: done, 3: line})  # a batch line's prompt is nobody's wait
    feeding.fed = 8
    assert not hold(done, {0: done, 1: feeding})
