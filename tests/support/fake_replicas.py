"""Replica actors faked without Ray, for the router's unit tests (tests/unit/test_router.py,
tests/unit/test_socket_stream.py): shaped like Ray actor handles (`.generate.options(...).remote(...)`
gives an async iterable of awaitables, each one batch of deltas)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from raygate.protocol.config import ModelConfig
from raygate.protocol.generation import Delta, EmbedRequest, EmbedResult, GenerateRequest

CONFIG = ModelConfig(name="m", backend="synthetic")


def deltas(*texts: str, finish: bool = True) -> list[Delta]:
    out = [Delta(text=t, completion_tokens=i + 1, prompt_tokens=2) for i, t in enumerate(texts)]
    if finish and out:
        out[-1].finish_reason = "stop"
    return out


async def _value(v: Any) -> Any:
    return v


async def _raise(exc: BaseException) -> Any:
    raise exc


class FakeStream:
    """What `.options(num_returns="streaming").remote()` gives: an async iterator of object refs
    (awaitables), each holding one batch of deltas. `fail_at=i` makes the i-th ref raise."""

    def __init__(self, batches: list[list[Delta]], fail_at: int | None, error: BaseException | None) -> None:
        self.batches, self.fail_at, self.error = batches, fail_at, error
        self.pulled = 0

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Awaitable[Any]:
        i = self.pulled
        if self.fail_at is not None and i == self.fail_at:
            self.pulled += 1
            assert self.error is not None
            return _raise(self.error)
        if i >= len(self.batches):
            raise StopAsyncIteration
        self.pulled += 1
        return _value(self.batches[i])


class FakeMethod:
    def __init__(self, call: Callable[..., Any]) -> None:
        self._call = call
        self.options_seen: list[dict[str, Any]] = []

    def options(self, **kwargs: Any) -> FakeMethod:
        self.options_seen.append(kwargs)
        return self

    def remote(self, *args: Any) -> Any:
        return self._call(*args)


class FakeActor:
    def __init__(
        self,
        name: str,
        batches: list[list[Delta]] | None = None,
        *,
        fail_at: int | None = None,
        error: BaseException | None = None,
        embed: Callable[[EmbedRequest], Awaitable[EmbedResult]] | None = None,
    ) -> None:
        self.name = name
        self.streams: list[FakeStream] = []
        self.embeds = 0

        def generate(request: GenerateRequest) -> FakeStream:
            stream = FakeStream(batches or [], fail_at, error)
            self.streams.append(stream)
            return stream

        async def do_embed(request: EmbedRequest) -> EmbedResult:
            self.embeds += 1
            if error is not None:
                raise error
            return EmbedResult(embeddings=[[1.0]], prompt_tokens=1) if embed is None else await embed(request)

        self.generate = FakeMethod(generate)
        self.embed = FakeMethod(do_embed)


async def collect(it: AsyncIterator[Delta]) -> list[Delta]:
    return [d async for d in it]
