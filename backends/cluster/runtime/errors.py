"""Ray's errors as the typed error tree (`raygate.protocol.errors`), in one table per kind of callee.

A call to an actor fails in two ways Ray tells apart: the remote code raised (`RayTaskError`, whose
`cause` is what it raised), or the actor died under the call (`RayActorError`). Clients must see
neither: a typed error the remote raised reaches them as itself (a 400 stays a 400), a vanished
replica as a 503 to retry, anything else as a 500 naming the model.

A replica that died under a call is *not* a retry row (issue #12): the request may be what killed
it (a grammar that crashed llama.cpp), and sending it on crashed every replica of the model in
turn. It fails once, saying so; a draining replica, which refused before running anything, is
still retried, and so is one the controller stopped on purpose after draining it (`ray.kill`: a
gateway whose routing table still lists it can call it in that moment; nothing ran). Like httpx's
`HTTPCORE_EXC_MAP`, each caller states this as an ordered table instead of an `isinstance` ladder;
the router's retry rule (only when nothing was sent yet) reads the same rows.

Order matters: Ray raises a `RayTaskError` as an instance of a class made to derive from the
cause's type too, so "the remote raised" rows are tried before "Ray raised" rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from ray.exceptions import RayActorError, RayTaskError

from raygate.protocol.errors import EngineError, OpenAIError, ServiceUnavailableError


class RemoteError(Exception):
    """What a replica raised, carried over its socket (`socket_stream.py`): Ray's `RayTaskError`
    for a stream that did not go over Ray, with the same `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class StreamLostError(ConnectionError):
    """A replica's socket closed before its stream ended: the process died under the call, as Ray's
    `RayActorError` says of an actor."""


# What a call to a replica raises when it fails, over Ray or over the replica's socket.
CALL_ERRORS = (RayTaskError, RayActorError, RemoteError, StreamLostError)


def remote_cause(exc: BaseException) -> BaseException | None:
    """What the remote code raised, if `exc` says it raised (over Ray or a replica's socket);
    None when the callee itself failed (died, vanished) or `exc` is no call error."""
    return exc.cause if isinstance(exc, RayTaskError | RemoteError) else None


class ReplicaDrainingError(RuntimeError):
    """The replica is being stopped and takes no new requests; the caller should pick another."""


class ReplicaDiedError(ServiceUnavailableError):
    """The replica process died while it held this request. Not retried elsewhere: the request
    may be what killed it (module docstring). A 503 (`service_unavailable`, as before, so clients
    that handle a lost replica keep working) with its own code."""

    default_code = "replica_died"

    @classmethod
    def serving(cls, model: str) -> ReplicaDiedError:
        return cls(
            f"The replica of `{model}` serving this request died while handling it. The request was "
            "not sent to another replica, in case it is what made the replica fail; the model "
            "replaces the replica. Retry if the failure was not caused by this request."
        )


# Where a row looks: at what the remote code raised, or at the error Ray itself raised.
Origin = Literal["remote", "ray"]
# Builds the client's error from (what the callee is called, the matched exception).
Make = Callable[[str, BaseException], OpenAIError]


@dataclass(frozen=True, slots=True)
class Row:
    """One rule of an `ErrorTable`: where to look (`origin`), which exception types match, how to build the
    client's error, and whether a retry elsewhere is safe."""

    origin: Origin
    types: type[BaseException] | tuple[type[BaseException], ...]
    make: Make
    retry: bool = False  # safe to send again elsewhere if nothing reached the client yet
    when: Callable[[BaseException], bool] | None = None  # a further test on the matched exception


@dataclass(frozen=True, slots=True)
class Mapped:
    """What the matching `Row` produced: the client's error, and whether another replica may be tried."""

    error: OpenAIError
    retry: bool


def same_error(_: str, exc: BaseException) -> OpenAIError:
    """The remote's own typed error, rebuilt: a plain instance of its class, not Ray's
    dual-class wrapper (whose message carries the remote traceback)."""
    assert isinstance(exc, OpenAIError)
    return type(exc)(exc.message, param=exc.param, code=exc.code)


class ErrorTable:
    """An ordered list of rows; the first that matches makes the error."""

    def __init__(self, *rows: Row) -> None:
        self.rows = rows

    def map(self, exc: BaseException, subject: str) -> Mapped | None:
        """The typed error for `exc` (a Ray error, usually), or None if no row matches."""
        cause = remote_cause(exc)
        for row in self.rows:
            found = cause if row.origin == "remote" else exc
            if found is not None and isinstance(found, row.types) and (row.when is None or row.when(found)):
                return Mapped(row.make(subject, found), row.retry)
        return None

    def error(self, exc: BaseException, subject: str) -> OpenAIError:
        """The typed error for `exc`; an unmatched one becomes a plain 500 naming `subject`."""
        mapped = self.map(exc, subject)
        return mapped.error if mapped is not None else OpenAIError(f"`{subject}` failed: {exc}")

    @contextlib.contextmanager
    def raising(self, subject: str) -> Iterator[None]:
        """Around one Ray call: a Ray error leaves as its typed error (httpx's `map_exceptions`)."""
        try:
            yield
        except (RayTaskError, RayActorError) as exc:
            raise self.error(exc, subject) from None


# What Ray's GCS says of an actor that `ray.kill` ended (its ActorDiedError carries the text).
_RAY_KILL = "killed by `ray.kill`"


def stopped_by_controller(exc: BaseException) -> bool:
    """The replica was ended on purpose: the controller drains a replica, then `ray.kill`s it
    (scale-down, rolling update, delete). A gateway whose routing table has not yet dropped it
    can still send it a request in that moment, which then meets a dead actor although the
    request ran nowhere and killed nothing (issue 51: a rerank's 503 `replica_died` outside any
    fault): safe to send to another replica. A crash (SIGKILL, OOM, a segfault) or a lost node
    says otherwise and stays `replica_died`."""
    return _RAY_KILL in str(exc)


def _no_replica(model: str, _: BaseException) -> OpenAIError:
    return ServiceUnavailableError(f"No replica of `{model}` could take the request; please retry.")


def _itself(_: str, exc: BaseException) -> OpenAIError:
    assert isinstance(exc, OpenAIError)
    return exc


def _model_failed(model: str, exc: BaseException) -> OpenAIError:
    return EngineError(f"Model `{model}` failed: {exc}")


# A model's replicas (`ModelWorker`), called by the router; the subject is the model's name.
REPLICA_ERRORS = ErrorTable(
    Row("remote", OpenAIError, same_error),
    Row("remote", (RayActorError, ReplicaDrainingError), _no_replica, retry=True),
    Row("remote", BaseException, _model_failed),
    Row("ray", RayActorError, _no_replica, retry=True, when=stopped_by_controller),
    Row("ray", (RayActorError, StreamLostError), lambda model, _: ReplicaDiedError.serving(model)),
    Row("ray", OpenAIError, _itself),  # not a Ray error at all: already typed
    Row("ray", BaseException, _model_failed),
)

# The controller, called by the gateway's admin routes; the subject is unused.
CONTROLLER_ERRORS = ErrorTable(
    Row("remote", OpenAIError, same_error),
    Row("remote", BaseException, lambda _, cause: OpenAIError(f"The controller failed: {cause}")),
    Row(
        "ray",
        RayActorError,
        lambda _, __: ServiceUnavailableError("The controller is restarting; please retry."),
    ),
)

# The Responses store actor, called by the gateway's /v1/responses routes; the subject is unused.
STORE_ERRORS = ErrorTable(
    Row("remote", BaseException, lambda _, cause: OpenAIError(f"The response store failed: {cause}")),
    Row(
        "ray",
        RayActorError,
        lambda _, __: ServiceUnavailableError("The response store is restarting; please retry."),
    ),
)

# The ledger actor (usage, keys, audit), called by the gateway; the subject is unused.
LEDGER_ERRORS = ErrorTable(
    Row("remote", BaseException, lambda _, cause: OpenAIError(f"The ledger failed: {cause}")),
    Row(
        "ray",
        RayActorError,
        lambda _, __: ServiceUnavailableError("The ledger is restarting; please retry."),
    ),
)
