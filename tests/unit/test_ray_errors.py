"""`raygate.backends.cluster.runtime.errors`: Ray's errors as the typed error tree, one table per callee. Ray's
exception classes are built here as Ray builds them (no cluster is started)."""

from __future__ import annotations

import pytest
from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

from raygate.backends.cluster.runtime.errors import (
    CONTROLLER_ERRORS,
    REPLICA_ERRORS,
    ReplicaDiedError,
    ReplicaDrainingError,
)
from raygate.protocol.errors import (
    BadRequestError,
    ContextLengthExceededError,
    EngineError,
    OpenAIError,
    ServiceUnavailableError,
)


def task_error(cause: BaseException) -> RayTaskError:
    """What `await actor.method.remote()` raises when the method raised `cause`: an instance of a
    class derived from both RayTaskError and the cause's class."""
    error = RayTaskError("ModelWorker.generate", "Traceback (remote)...", cause)  # type: ignore[no-untyped-call]
    wrapped: RayTaskError = error.as_instanceof_cause()  # type: ignore[no-untyped-call]
    return wrapped


def test_a_typed_error_from_the_replica_reaches_the_client_as_itself() -> None:
    cause = ContextLengthExceededError("too long", param="messages")
    mapped = REPLICA_ERRORS.map(task_error(cause), "chat")
    assert mapped is not None and not mapped.retry
    err = mapped.error
    assert type(err) is ContextLengthExceededError  # a plain instance, not Ray's dual class
    assert (err.message, err.param, err.code) == ("too long", "messages", "context_length_exceeded")


@pytest.mark.parametrize("cause", [ReplicaDrainingError("draining"), RayActorError()])
def test_a_replica_that_refused_or_lost_its_actor_is_a_retryable_503(cause: BaseException) -> None:
    mapped = REPLICA_ERRORS.map(task_error(cause), "chat")
    assert mapped is not None and mapped.retry
    assert type(mapped.error) is ServiceUnavailableError
    assert mapped.error.message == "No replica of `chat` could take the request; please retry."
    again = REPLICA_ERRORS.map(task_error(cause), "")
    assert again is not None and again.retry


def test_a_replica_that_died_under_the_call_is_a_503_that_is_not_retried() -> None:
    """Changed in issue #12: it was a retryable 503, and a poison request crashed every replica."""
    mapped = REPLICA_ERRORS.map(RayActorError(), "chat")
    assert mapped is not None and not mapped.retry
    assert type(mapped.error) is ReplicaDiedError
    assert (mapped.error.status_code, mapped.error.code) == (503, "replica_died")
    assert "died while handling it" in mapped.error.message
    assert "not sent to another replica" in mapped.error.message


def test_anything_else_the_replica_raised_is_an_engine_error_naming_the_model() -> None:
    mapped = REPLICA_ERRORS.map(task_error(ZeroDivisionError("oops")), "chat")
    assert mapped is not None and not mapped.retry
    assert type(mapped.error) is EngineError
    assert mapped.error.message == "Model `chat` failed: oops"
    typed = REPLICA_ERRORS.map(task_error(BadRequestError("no")), "")
    assert typed is not None and not typed.retry


def test_non_ray_errors_pass_or_become_engine_errors() -> None:
    typed = BadRequestError("already typed")
    assert REPLICA_ERRORS.error(typed, "chat") is typed
    assert REPLICA_ERRORS.error(ValueError("x"), "chat").message == "Model `chat` failed: x"


def test_the_controllers_typed_errors_pass_and_others_are_500s() -> None:
    err = CONTROLLER_ERRORS.error(task_error(BadRequestError("bad spec", param="name")), "controller")
    assert type(err) is BadRequestError and err.param == "name"
    err = CONTROLLER_ERRORS.error(task_error(KeyError("k")), "controller")
    assert type(err) is OpenAIError and err.message == "The controller failed: 'k'"
    err = CONTROLLER_ERRORS.error(RayActorError(), "controller")
    assert type(err) is ServiceUnavailableError and "restarting" in err.message
    restarting = CONTROLLER_ERRORS.map(RayActorError(), "")
    assert restarting is not None and not restarting.retry  # admin calls are never re-sent


def test_raising_maps_ray_errors_and_lets_others_through() -> None:
    with pytest.raises(ServiceUnavailableError), CONTROLLER_ERRORS.raising("controller"):
        raise RayActorError()
    # Not a Ray error: not the table's business.
    with pytest.raises(ValueError), CONTROLLER_ERRORS.raising("controller"):
        raise ValueError("local bug")
    with pytest.raises(EngineError, match="Model `m` failed"), REPLICA_ERRORS.raising("m"):
        raise task_error(RuntimeError("x"))


def actor_died(error_message: str) -> ActorDiedError:
    """What a call on a dead actor raises: Ray builds it from the GCS's death context."""
    context = ActorDiedErrorContext(
        error_message=error_message, class_name="ModelWorker", actor_id=b"\1" * 16
    )
    return ActorDiedError(context)


def test_a_replica_the_controller_stopped_is_retried_elsewhere() -> None:
    """Issue 51: the controller drains a replica, then `ray.kill`s it; a gateway whose table still
    listed it sent a rerank there and answered 503 `replica_died`, though nothing ran."""
    killed = actor_died("The actor is dead because it was killed by `ray.kill`.")
    mapped = REPLICA_ERRORS.map(killed, "embed")
    assert mapped is not None and mapped.retry
    assert type(mapped.error) is ServiceUnavailableError


@pytest.mark.parametrize(
    "message",
    [
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR",
        "The actor died because its node has died.",
        "The actor is dead because its owner has died.",
    ],
)
def test_a_replica_that_crashed_or_lost_its_node_is_still_not_retried(message: str) -> None:
    mapped = REPLICA_ERRORS.map(actor_died(message), "chat")
    assert mapped is not None and not mapped.retry
    assert type(mapped.error) is ReplicaDiedError
