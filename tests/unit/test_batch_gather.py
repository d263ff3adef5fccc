"""The batched llama.cpp engine gathers the requests that arrive with the one waking it
(`BatchedLlamaCppEngine._gather`), without a model: its scheduler's queues only."""

from __future__ import annotations

from concurrent.futures import Future

from raygate.backends.engines.llama_cpp.batched import BatchedLlamaCppEngine
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
    engine._take_incoming({}, [[] for _ in range(4)], [0] * 4)
    assert engine._pending == seqs and [s.order for s in seqs] == [0, 1, 2]
    assert ran == ["command"] and done.done()
    assert engine._incoming.empty()


def test_a_busy_engine_takes_only_what_has_arrived() -> None:
    engine = BatchedLlamaCppEngine("never-loaded.gguf", engine_kwargs={"n_ctx": 64, "n_seq_max": 4})
    running = {0: sequence([9], 1, 90)}
    engine._incoming.put(first := sequence([1] * 4, 0, None))
    engine._take_incoming(running, [[9], [], [], []], [1, 0, 0, 0])
    assert engine._pending == [first]
