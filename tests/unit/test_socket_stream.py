"""backends/cluster/routing/socket_stream.py: a replica's deltas over a real Unix socket, without Ray: every
batch in order, the replica's typed errors as themselves, the backpressure window, a closed stream
cancelling the replica's generator and a vanished replica reported as dead, a request the replica
cannot load answered as an error, a killed replica's socket directory cleared; the router taking
this path for a replica on its own node, and Ray's when the socket is out of reach."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from raygate.backends.cluster.routing import router as router_module
from raygate.backends.cluster.routing import socket_stream
from raygate.backends.cluster.routing.route_table import DeploymentRoute, ReplicaRoute
from raygate.backends.cluster.routing.router import UNREAD_BATCHES, ModelRouter, Replica
from raygate.backends.cluster.routing.socket_stream import SocketServer, open_stream
from raygate.backends.cluster.runtime.errors import (
    REPLICA_ERRORS,
    RemoteError,
    ReplicaDiedError,
    StreamLostError,
)
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import BadRequestError
from raygate.protocol.generation import Delta, GenerateRequest, SamplingParams
from tests.support.fake_replicas import CONFIG, FakeActor, collect, deltas

REQUEST = GenerateRequest(request_id="r1", sampling=SamplingParams(), prompt="hi")


def delta(i: int, last: bool = False, text: str = "") -> Delta:
    return Delta(
        text=text or f"t{i}", completion_tokens=i + 1, prompt_tokens=2, finish_reason="stop" if last else None
    )


class FakeWorker:
    """A replica's `generate`: `n` one-delta batches (None: without end), counting what it made
    and whether it was closed."""

    def __init__(self, n: int | None = 3, error: BaseException | None = None, text: str = "") -> None:
        self.n, self.error, self.text = n, error, text
        self.made = 0
        self.closed = asyncio.Event()
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[list[Delta], None]:
        self.requests.append(request)
        try:
            i = 0
            while self.n is None or i < self.n:
                if self.error is not None and i == 1:
                    raise self.error
                self.made += 1
                yield [delta(i, last=i + 1 == self.n, text=self.text)]
                i += 1
                await asyncio.sleep(0)
        finally:
            self.closed.set()


async def serving(replica: FakeWorker) -> SocketServer:
    server = SocketServer(replica.generate)
    assert await server.start() is not None
    return server


async def test_every_batch_arrives_in_order_and_the_request_reaches_the_replica() -> None:
    replica = FakeWorker(3)
    server = await serving(replica)
    try:
        assert server.path is not None
        got = [b async for b in await open_stream(server.path, REQUEST, UNREAD_BATCHES)]
        assert [[d.text for d in b] for b in got] == [["t0"], ["t1"], ["t2"]]
        assert got[-1][-1].finish_reason == "stop"
        assert replica.requests == [REQUEST]
    finally:
        server.close()


async def test_the_replicas_typed_error_arrives_as_itself() -> None:
    server = await serving(FakeWorker(3, error=BadRequestError("no such thing", param="tools")))
    try:
        assert server.path is not None
        with pytest.raises(RemoteError) as caught:
            async for _ in await open_stream(server.path, REQUEST, UNREAD_BATCHES):
                pass
        mapped = REPLICA_ERRORS.map(caught.value, "m")
        assert mapped is not None and not mapped.retry
        assert isinstance(mapped.error, BadRequestError)
        assert (mapped.error.message, mapped.error.param) == ("no such thing", "tools")
    finally:
        server.close()


async def test_the_replica_closes_only_after_the_gateway() -> None:
    """After its last frame the replica waits for the gateway to close: closing first, with the
    gateway's acknowledgements unread, resets the gateway's end, and the reset can overtake the
    frame still unread there (in the ops tests: an engine error taken for a dead replica)."""
    server = await serving(FakeWorker(3, error=BadRequestError("bad", param="x")))
    try:
        assert server.path is not None
        reader, writer = await asyncio.open_unix_connection(server.path)
        writer.write(socket_stream._frame((REQUEST, UNREAD_BATCHES)))
        kinds = []
        while not kinds or kinds[-1] == "batch":
            kinds.append((await socket_stream._read(reader))[0])
            writer.write(socket_stream._ACK)
        assert kinds == ["batch", "error"]
        with pytest.raises(TimeoutError):  # neither more bytes nor the end: still open
            await asyncio.wait_for(reader.read(1), 0.3)
        writer.close()
    finally:
        server.close()


async def test_an_error_that_does_not_pickle_still_says_what_failed() -> None:
    class OddError(Exception):
        def __init__(self, a: int, b: int) -> None:  # pickling calls OddError(msg): fails
            super().__init__(f"odd {a} {b}")

    server = await serving(FakeWorker(3, error=OddError(1, 2)))
    try:
        assert server.path is not None
        with pytest.raises(RemoteError) as caught:
            async for _ in await open_stream(server.path, REQUEST, UNREAD_BATCHES):
                pass
        assert "OddError: odd 1 2" in str(REPLICA_ERRORS.error(caught.value, "m"))
    finally:
        server.close()


def _refuse_to_load() -> None:
    raise ModuleNotFoundError("No module named 'protocol.newer'")


class FromNewerCode:
    """A request this replica's code cannot load (the gateway already upgraded, say)."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return _refuse_to_load, ()


async def test_a_request_the_replica_cannot_load_is_an_error_of_that_request() -> None:
    replica = FakeWorker(3)
    server = await serving(replica)
    try:
        assert server.path is not None
        with pytest.raises(RemoteError) as caught:
            async for _ in await open_stream(server.path, FromNewerCode(), UNREAD_BATCHES):  # type: ignore[arg-type]
                pass
        error = REPLICA_ERRORS.error(caught.value, "m")  # a 500 that says why, not replica_died
        mapped = REPLICA_ERRORS.map(caught.value, "m")
        assert not isinstance(error, ReplicaDiedError) and not (mapped is not None and mapped.retry)
        assert error.status_code == 500
        assert "could not read the request: ModuleNotFoundError" in str(error)
        assert replica.requests == []
        # and the replica still serves the next request
        got = [b async for b in await open_stream(server.path, REQUEST, UNREAD_BATCHES)]
        assert len(got) == 3
    finally:
        server.close()


async def test_a_reader_that_stops_reading_stops_the_replica_within_the_window() -> None:
    replica = FakeWorker(None)
    server = await serving(replica)
    try:
        assert server.path is not None
        window = 4
        batches = await open_stream(server.path, REQUEST, window)
        await anext(batches)
        await asyncio.sleep(0.3)  # the replica runs on: it could make thousands of batches
        assert replica.made <= window + 2, replica.made
        assert not replica.closed.is_set()
        await anext(batches)  # reading again lets it go on
        await asyncio.sleep(0.1)
        assert replica.made > window
        await batches.aclose()
        # Closing the stream cancels the replica's generator (the engine request's abort).
        await asyncio.wait_for(replica.closed.wait(), 5)
    finally:
        server.close()


async def test_closing_while_the_replica_writes_cancels_it() -> None:
    """The gateway closes while the replica is still sending (a client dropped mid-answer): the
    replica's writes then fail and its reads see a reset instead of an end, which must cancel the
    stream just the same (it once went on to the end of a 10,000-token answer)."""
    replica = FakeWorker(None, text="x" * 200_000)
    server = await serving(replica)
    try:
        assert server.path is not None
        batches = await open_stream(server.path, REQUEST, 1_000)
        await anext(batches)
        await asyncio.sleep(0.2)  # the replica writes on, far ahead of this reader
        await batches.aclose()
        await asyncio.wait_for(replica.closed.wait(), 5)
    finally:
        server.close()


async def test_a_replica_that_vanishes_mid_stream_is_reported_dead(tmp_path: object) -> None:
    path = f"{tmp_path}/r.sock"

    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await socket_stream._read(reader)
        writer.write(socket_stream._frame(("batch", [delta(0)])))
        await writer.drain()
        writer.transport.abort()  # as a killed process's socket

    server = await asyncio.start_unix_server(dies, path)
    try:
        got = []
        with pytest.raises(StreamLostError):
            async for batch in await open_stream(path, REQUEST, UNREAD_BATCHES):
                got.append(batch)
        assert len(got) == 1
    finally:
        server.close()


async def test_the_router_streams_over_the_socket_of_a_replica_on_its_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(router_module, "_this_node", lambda: "node-a")
    replica = FakeWorker(3)
    server = await serving(replica)
    try:
        assert server.path is not None
        # `actor=None`: any Ray call would fail; the deltas can only come over the socket.
        r = ModelRouter(
            ModelConfig(name="m", backend="synthetic"), [Replica(None, "a", "node-a", socket=server.path)]
        )
        out = [d async for d in r.generate(REQUEST)]
        assert [d.text for d in out] == ["t0", "t1", "t2"]
        assert r.replicas[0].inflight == 0
    finally:
        server.close()


async def test_the_router_reports_a_vanished_replica_as_dead(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setattr(router_module, "_this_node", lambda: "node-a")
    path = f"{tmp_path}/r.sock"

    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await socket_stream._read(reader)
        writer.transport.abort()

    server = await asyncio.start_unix_server(dies, path)
    try:
        r = ModelRouter(
            ModelConfig(name="m", backend="synthetic"), [Replica(None, "a", "node-a", socket=path)]
        )
        with pytest.raises(ReplicaDiedError):
            async for _ in r.generate(REQUEST):
                pass
        assert r.replicas[0].dead
    finally:
        server.close()


async def test_a_socket_out_of_reach_falls_back_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same node id, other file system (a container beside the replica's): nothing was sent, so
    the request goes over Ray, and so do the next ones."""
    monkeypatch.setattr(router_module, "_this_node", lambda: "node-a")
    actor = FakeActor("a", [deltas("over", " ray")])
    r = ModelRouter(CONFIG, [Replica(actor, "a", "node-a", socket="/nonexistent/replica.sock")])
    assert [d.text for d in await collect(r.generate(REQUEST))] == ["over", " ray"]
    assert r.replicas[0].socket == "" and not r.replicas[0].dead
    # The controller's next table names the socket again: this router keeps its own verdict.
    route = ReplicaRoute("a", actor, "node-a", 2048, socket="/nonexistent/replica.sock")
    r.update(DeploymentRoute(CONFIG, "ready", None, [route]))
    await collect(r.generate(REQUEST))
    assert len(actor.streams) == 2 and r.replicas[0].socket == ""


async def test_a_killed_replicas_socket_directory_is_removed_by_the_next_replica(tmp_path: Path) -> None:
    def dead_socket(name: str, age_s: float) -> Path:
        """What a killed replica leaves: its socket file, bound, with nobody listening."""
        folder = tmp_path / name
        folder.mkdir()
        path = folder / socket_stream.SOCKET_NAME
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(path))
        os.utime(path, (time.time() - age_s,) * 2)
        return folder

    killed = dead_socket("raygate-killed", age_s=120)
    binding = dead_socket("raygate-binding", age_s=0)  # a replica starting right now
    other = tmp_path / "raygate-llama-cpp-build"  # not a replica's: no socket in it
    other.mkdir()
    live = SocketServer(FakeWorker(3).generate)
    tempfile_dir = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        assert await live.start() is not None  # the replica that starts clears what is stale
        assert live.path is not None
        os.utime(live.path, (time.time() - 120,) * 2)
        assert socket_stream.remove_stale_sockets(str(tmp_path)) == []  # alive: kept
        assert not killed.exists()
        assert binding.exists() and other.exists()
        got = [b async for b in await open_stream(live.path, REQUEST, UNREAD_BATCHES)]
        assert len(got) == 3
    finally:
        tempfile.tempdir = tempfile_dir
        live.close()
