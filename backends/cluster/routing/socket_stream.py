"""A generation's deltas between a replica and a gateway on the same node: a Unix socket instead of
Ray's streaming generator.

Why: at one request at a time the gateway's fixed cost decides TTFT against llama-server, and
most of it was Ray's two trips per request: the actor call reaching the replica (~1.8-2.4 ms
measured on 2 busy cores) and the first item of its streaming generator reaching the gateway
(~2.6-4 ms: the replica's event loop hands each item to an executor thread, which reports it over
gRPC to the gateway's core worker, which wakes the gateway's loop twice). Over a socket each
direction is one write and one wake-up. Ray still places, starts, watches, drains and stops the
replica, and carries every other call (embeddings, tokenizer, stats); replicas on other nodes
stream over Ray as before (`router.py`).

The protocol, one connection per request: the gateway sends `(request, window)`; the replica
answers with `("batch", [Delta, ...])` frames, then `("end", None)` or `("error", exception)`.
A frame is a 4-byte length and a pickle. The gateway acknowledges each batch it has read with one
byte, and the replica sends at most `window` batches ahead of the acknowledgements, which is
Ray's generator backpressure (`router.UNREAD_BATCHES`) again: a client that reads nothing stops
the replica after as many batches as before. Closing the connection (client gone, timeout) cancels
the replica's stream, which aborts the engine request, as `ray.cancel` did.

The socket lives in a directory only its user can enter (`mkdtemp`, mode 0700), so only processes
of the user running Ray can connect, as only they can reach Ray's own object store; pickles are
read from such peers only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from raygate.backends.cluster.runtime.errors import RemoteError, StreamLostError
from raygate.protocol.generation import Delta, GenerateRequest

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
_ACK = b"\x01"
SOCKET_NAME = "replica.sock"
SOCKET_DIR_PREFIX = "raygate-"
# How long a replica waits for the gateway to close after the last frame before closing itself.
CLOSE_WAIT_S = 5.0
# A socket directory left by a replica that was killed (a drained one removes its own) is removed
# by the next replica that starts, once its socket is older than this and refuses connections.
STALE_AFTER_S = 60.0
# A Unix socket's path must fit `sun_path` (108 bytes with its terminating zero on Linux).
MAX_PATH = 107

Batches = Callable[[GenerateRequest], AsyncGenerator[list[Delta], None]]


def _frame(value: object) -> bytes:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


async def _read(reader: asyncio.StreamReader) -> Any:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(size))  # peers: this user's processes only


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives a pickle round trip (our typed errors do: `OpenAIError.__reduce__`),
    else a RuntimeError with its type and message, so the gateway still says what failed."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def remove_stale_sockets(parent: str) -> list[str]:
    """Remove the socket directories under `parent` whose replica is gone: the socket exists, is
    older than STALE_AFTER_S (a replica binding right now may refuse for an instant) and refuses
    a connection. Returns what it removed."""
    now = time.time()
    removed = []
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith(SOCKET_DIR_PREFIX):
                continue
            path = os.path.join(entry.path, SOCKET_NAME)
            try:
                if now - os.lstat(path).st_mtime < STALE_AFTER_S:
                    continue
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.settimeout(1.0)
                    probe.connect(path)
            except ConnectionRefusedError:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
            except OSError:
                continue  # no socket there, not ours to enter, or alive but slow: leave it
    return removed


class SocketServer:
    """The replica's end: serves `batches(request)` to each connection (module docstring)."""

    def __init__(self, batches: Batches) -> None:
        self._batches = batches
        self._server: asyncio.AbstractServer | None = None
        self._dir: str | None = None
        self.path: str | None = None

    async def start(self) -> str | None:
        """Listen; returns the socket's path, or None where no socket can be made (the gateway then
        streams over Ray)."""
        await asyncio.to_thread(remove_stale_sockets, tempfile.gettempdir())
        folder = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX)
        path = os.path.join(folder, SOCKET_NAME)
        if len(path.encode()) > MAX_PATH:
            os.rmdir(folder)
            return None
        try:
            self._server = await asyncio.start_unix_server(self._serve, path)
        except OSError as exc:
            log.warning("no replica socket (deltas go over Ray): %s", exc)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        self._dir, self.path = folder, path
        return path

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request, window = await _read(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except Exception as exc:
                # Bytes that arrived whole but do not load here (a gateway on other code, mid
                # upgrade): the gateway hears why, as an error of this request, not a dead replica.
                unread = RuntimeError(f"the replica could not read the request: {type(exc).__name__}: {exc}")
                writer.write(_frame(("error", unread)))
                with contextlib.suppress(TimeoutError, ConnectionError):
                    await asyncio.wait_for(reader.read(), CLOSE_WAIT_S)  # close after the gateway
                return
            await self._stream(request, int(window), reader, writer)
        finally:
            writer.close()

    async def _stream(
        self,
        request: GenerateRequest,
        window: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        me = asyncio.current_task()
        assert me is not None
        sent = acked = 0
        room = asyncio.Event()
        gone = done = False

        async def acknowledgements() -> None:
            """Counts the gateway's acknowledgements; its end closing cancels the stream. A close
            while this end was writing reads as a reset (the failed write), not as an end."""
            nonlocal acked, gone
            with contextlib.suppress(ConnectionError):
                while data := await reader.read(4096):
                    acked += len(data)
                    if sent - acked < window:
                        room.set()
            gone = True
            if not done:
                me.cancel()

        watcher = asyncio.create_task(acknowledgements())
        try:
            try:
                async with contextlib.aclosing(self._batches(request)) as batches:
                    async for batch in batches:
                        while sent - acked >= window:
                            room.clear()
                            await room.wait()
                        writer.write(_frame(("batch", batch)))
                        sent += 1
                last: tuple[str, object] = ("end", None)
            except Exception as exc:
                last = ("error", _portable(exc))
            done = True
            writer.write(_frame(last))
            # Close after the gateway (it closes on reading the last frame): a Unix socket closed
            # with acknowledgements unread resets the other end, and a reset can overtake the
            # frame still unread there (measured: a replica taken for dead).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watcher, CLOSE_WAIT_S)
        except asyncio.CancelledError:
            if not gone:
                raise
        finally:
            watcher.cancel()


async def open_stream(path: str, request: GenerateRequest, window: int) -> AsyncGenerator[list[Delta], None]:
    """The gateway's end: connects (an `OSError` if the socket cannot be reached from here: nothing
    was sent), then gives the replica's batches for `request`."""
    reader, writer = await asyncio.open_unix_connection(path)
    return _batches(reader, writer, request, window)


async def _batches(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: GenerateRequest, window: int
) -> AsyncGenerator[list[Delta], None]:
    """Raises `RemoteError` with what the replica raised, `StreamLostError` if its end went away
    during the stream (it died). Closing this generator closes the connection, which cancels the
    request in the replica."""
    path = writer.get_extra_info("peername")
    try:
        writer.write(_frame((request, window)))
        while True:
            try:
                kind, value = await _read(reader)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise StreamLostError(f"replica socket {path} closed: {exc}") from None
            if kind == "batch":
                writer.write(_ACK)
                yield value
            elif kind == "error":
                raise RemoteError(value)
            else:
                return
    finally:
        writer.close()
