"""`ResponsesServing`: `POST /v1/responses` on the serving base.

The body becomes the same engine `GenerateRequest` chat sends (messages, tools, sampling), so both
engines serve it unchanged; `OutputBuilder` turns the deltas into output items and stream events.
Two things differ from chat and are why `respond` is this class's own: a stored conversation is
read before generating (`previous_response_id`) and the answer is written to the store before the
client gets its last event or its body; and a stream is typed events (named SSE events:
`server/serving/streaming.py`, `RESPONSES_SSE`), not one chunk per delta, so `stream` renders
them from `events` rather than from per-delta chunk hooks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import ClassVar

from fastapi import Request
from fastapi.responses import Response

from raygate.backends.cluster.stores.responses import ResponseStoreClient
from raygate.backends.streams import closing
from raygate.protocol.common import Usage
from raygate.protocol.errors import EngineError, OpenAIError
from raygate.protocol.generation import Delta, GenerateRequest, ToolCallDelta
from raygate.protocol.images import ImageReader
from raygate.protocol.response_events import ErrorEvent, ResponseEvent
from raygate.protocol.response_items import Item, engine_messages, item_id
from raygate.protocol.response_object import (
    FunctionToolOut,
    IncompleteDetails,
    ResponseErrorOut,
    ResponseObject,
    ResponseUsage,
    StoredResponse,
    TextConfigOut,
    TextFormatOut,
    ToolChoiceFunctionOut,
)
from raygate.protocol.responses import CreateResponseRequest, ResponseStatus
from raygate.server.serving.base import GenerationServing, json_response
from raygate.server.serving.collect import CLIENT_CLOSED_REQUEST, collect
from raygate.server.serving.fanout import merge
from raygate.server.serving.response_output import OutputBuilder
from raygate.server.serving.stored_responses import owner_of, read_stored
from raygate.server.serving.streaming import Event, Payload, SseDialect, sse_response
from raygate.server.serving.tally import Tally

log = logging.getLogger(__name__)


# The Responses stream names its events and ends without `[DONE]`; `events()` ends a failed stream
# with its own `error` and `response.failed` events, so the dialect's error frame is a last resort.
RESPONSES_SSE = SseDialect(
    error=lambda exc: Event(
        "error",
        ErrorEvent(sequence_number=0, code=exc.code, message=exc.message, param=exc.param).to_json(),
    ),
    done=b"",
)


async def _named(events: AsyncIterator[ResponseEvent]) -> AsyncIterator[Event]:
    async with closing(events):  # closed at a `yield` too (backpressure)
        async for event in events:
            yield Event(event.type, event.to_json())


class ResponsesServing(GenerationServing[CreateResponseRequest]):
    """One response: a single sequence over the conversation, rendered as output items."""

    endpoint: ClassVar[str] = "responses"
    id_prefix: ClassVar[str] = "resp"
    sse_dialect: ClassVar[SseDialect] = RESPONSES_SSE

    def __init__(self, body: CreateResponseRequest, request: Request) -> None:
        super().__init__(
            body, request, stream=bool(body.stream), samples_per_prompt=1, include_usage=False, user=body.user
        )
        self.id = item_id("resp")  # OpenAI's `resp_…`, not the base's `resp-…`
        self.store: ResponseStoreClient = request.app.state.responses
        self.owner = owner_of(request)
        self._input: list[Item] = []
        self._context: list[Item] = []

    async def respond(self) -> Response:
        model = self.resolve()
        await self._read_conversation()
        await self.read_images(model)
        deltas = merge([model.generate(r) for r in self.sampled_sequences(model)])
        if self.streaming:
            return await sse_response(self.stream(deltas), self.request, self.sse_dialect)
        tally = await collect(self.request, deltas)
        if tally is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        response = self.final_body(tally, 1)
        await self._save(response)
        return json_response(response)

    async def _read_conversation(self) -> None:
        """This request's input items, and the stored conversation it continues (404 if unknown)."""
        self._input = self.body.input_items()
        previous = self.body.previous_response_id
        if previous:
            stored = await read_stored(self.store, previous, self.owner, param="previous_response_id")
            self._context = stored.conversation()

    def walk_images(self, see: ImageReader) -> None:
        engine_messages(self.body.instructions, [*self._context, *self._input], see)

    def sequences(self) -> list[GenerateRequest]:
        body = self.body
        messages = engine_messages(body.instructions, [*self._context, *self._input], self.see())
        thinking, budget, kwargs = body.thinking()
        return [
            GenerateRequest(
                self.sequence_id(0),
                body.to_sampling_params(),
                messages=messages,
                tools=body.tools_spec(),
                thinking=thinking,
                thinking_budget=budget,
                template_kwargs=kwargs,
            )
        ]

    # --- the answer ------------------------------------------------------------------------------

    def final_body(self, tally: Tally, choices: int) -> ResponseObject:
        """The whole answer from the collected deltas, built by the same `OutputBuilder` a stream
        uses (fed as one delta)."""
        calls = [
            ToolCallDelta(index=i, arguments="".join(c.arguments), id=c.id, name=c.name)
            for i, c in enumerate(tally.tool_calls(0))
        ]
        builder = OutputBuilder(summary=self.body.wants_summary())
        builder.add(
            Delta(
                text=tally.text(0),
                completion_tokens=tally.completion_tokens.get(0, 0),
                prompt_tokens=tally.prompt_tokens.get(0, 0),
                finish_reason=tally.finish.get(0),
                tool_calls=calls or None,
                reasoning=tally.thought(0) or "",
            )
        )
        builder.close()
        return self._response(builder, self.usage(tally))

    def _response(
        self,
        builder: OutputBuilder,
        usage: Usage | None,
        status: ResponseStatus | None = None,
        error: ResponseErrorOut | None = None,
    ) -> ResponseObject:
        body = self.body
        if status is None:
            status = "completed" if builder.finish_reason in ("stop", "tool_calls") else "incomplete"
        cut = builder.finish_reason == "length"
        fmt = body.format()
        choice = body.tool_choice
        return ResponseObject(
            id=self.id,
            created_at=self.created,
            status=status,
            completed_at=int(time.time()) if status == "completed" else None,
            error=error,
            incomplete_details=IncompleteDetails(reason="max_output_tokens" if cut else None)
            if status == "incomplete"
            else None,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            model=body.model,
            output=list(builder.items),
            parallel_tool_calls=body.parallel_tool_calls is not False,
            previous_response_id=body.previous_response_id,
            store=body.store is not False,
            temperature=1.0 if body.temperature is None else body.temperature,
            text=TextConfigOut(format=TextFormatOut.of(fmt)),
            tool_choice=ToolChoiceFunctionOut(name=str(choice.name))
            if choice is not None and not isinstance(choice, str)
            else (choice or "auto"),
            tools=[FunctionToolOut.of(t) for t in body.function_tools()],
            top_p=1.0 if body.top_p is None else body.top_p,
            usage=None
            if usage is None
            else ResponseUsage.of(
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.cached_tokens,
                usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else 0,
            ),
            reasoning=body.reasoning.echo() if body.reasoning else None,
            user=body.user,
            metadata=body.metadata or {},
        )

    async def _save(self, response: ResponseObject) -> None:
        """Store the response with its input and the conversation before it (`store` defaults to
        true, as at OpenAI); a failure to store fails the request rather than hand out an id that
        will not be found."""
        if not response.store:
            return
        stored = StoredResponse(response=response, input=self._input, context=self._context)
        await self.store.put(response.id, self.owner, stored.to_json())

    # --- streaming -------------------------------------------------------------------------------

    def stream(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[Payload]:
        """The typed events as named SSE events."""
        return _named(self.events(deltas))

    async def events(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[ResponseEvent]:
        """The event sequence. Nothing is sent before the first delta, so a refusal before the first
        token (context too long, no replica) is still an HTTP error; later failures end the stream
        with `error` and `response.failed`."""
        async with closing(deltas):  # a stalled reader's stream is closed at a `yield`
            async for event in self._events(deltas):
                yield event

    async def _events(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[ResponseEvent]:
        builder = OutputBuilder(summary=self.body.wants_summary())
        tally = Tally()
        first = await anext(deltas, None)
        yield builder.lifecycle("response.created", self._response(builder, None, "in_progress"))
        yield builder.lifecycle("response.in_progress", self._response(builder, None, "in_progress"))
        try:
            if first is not None:
                tally.add(0, first[1])
                for event in builder.add(first[1]):
                    yield event
            async for _, delta in deltas:
                tally.add(0, delta)
                for event in builder.add(delta):
                    yield event
            for event in builder.close():
                yield event
            response = self._response(builder, self.usage(tally))
            await self._save(response)
        except Exception as exc:  # after the headers, the protocol's events carry the failure
            error = exc if isinstance(exc, OpenAIError) else EngineError(f"Stream failed: {exc}")
            if not isinstance(exc, OpenAIError):
                log.exception("response stream failed", exc_info=exc)
            yield ErrorEvent(
                sequence_number=builder.number(), code=error.code, message=error.message, param=error.param
            )
            failed = ResponseErrorOut(code="server_error", message=error.message)
            yield builder.lifecycle(
                "response.failed", self._response(builder, self.usage(tally), "failed", failed)
            )
            return
        if response.status == "completed":
            yield builder.lifecycle("response.completed", response)
        else:
            yield builder.lifecycle("response.incomplete", response)
