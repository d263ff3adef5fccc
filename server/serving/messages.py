"""`MessagesServing` and `CountTokensServing`: Anthropic's `POST /v1/messages` and
`POST /v1/messages/count_tokens`, on the serving base.

A Messages request runs exactly the path of a chat completion: the body becomes the same
`GenerateRequest` (protocol/messages.py builds its `ChatMessage`s, `ToolsSpec` and
`SamplingParams`), the base resolves the model, admits the request, runs it and collects or streams
its deltas; only the rendering differs. A count is the chat template's token count of the same
prompt (the `/tokenize` path), so it equals the usage a create with the same input reports.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from fastapi import Request
from fastapi.responses import Response

from raygate.backends.streams import closing
from raygate.protocol.config import Task
from raygate.protocol.generation import Delta, GenerateRequest, TokenizeRequest
from raygate.protocol.images import ImageReader
from raygate.protocol.messages import CountTokensRequest, MessagesRequest
from raygate.protocol.messages_response import (
    ContentBlock,
    CountTokensResponse,
    ErrorEvent,
    Message,
    MessageDeltaBody,
    MessageDeltaEvent,
    MessageStartEvent,
    MessageStopEvent,
    MessagesUsage,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    stop_reason,
    tool_use_id,
)
from raygate.server.serving.base import GenerationServing, Serving, json_response
from raygate.server.serving.message_blocks import BlockStream, event
from raygate.server.serving.streaming import Event, Payload, SseDialect
from raygate.server.serving.tally import Tally
from raygate.server.serving.thinking_signature import check_returned, sign

# Anthropic's streams: a late failure is an `error` event, and nothing follows `message_stop`.
ANTHROPIC_SSE = SseDialect(error=lambda exc: Event("error", ErrorEvent.of(exc).to_json()), done=b"")


class MessagesServing(GenerationServing[MessagesRequest]):
    """One message: a single sequence (Anthropic has no `n`), rendered as content blocks."""

    endpoint: ClassVar[str] = "messages"
    id_prefix: ClassVar[str] = "msg"
    sse_dialect: ClassVar[SseDialect] = ANTHROPIC_SSE

    def __init__(self, body: MessagesRequest, request: Request) -> None:
        super().__init__(
            body,
            request,
            stream=body.stream,
            samples_per_prompt=1,
            include_usage=False,
            user=body.metadata.user_id if body.metadata else None,
        )
        self.id = f"msg_{uuid.uuid4().hex}"  # Anthropic's shape, `msg_…`

    def walk_images(self, see: ImageReader) -> None:
        self.body.to_engine_messages(see)

    def sequences(self) -> list[GenerateRequest]:
        body = self.body
        check_returned(self.request, body)
        thinking, budget = body.thinking_switch()
        return [
            GenerateRequest(
                self.sequence_id(0),
                body.to_sampling_params(),
                messages=body.to_engine_messages(self.see()),
                tools=body.tools_spec(),
                thinking=thinking,
                thinking_budget=budget,
            )
        ]

    def _usage(self, tally: Tally) -> MessagesUsage:
        return MessagesUsage.of(
            tally.prompt_tokens.get(0, 0), tally.completion_tokens.get(0, 0), tally.cached_tokens.get(0)
        )

    def final_body(self, tally: Tally, choices: int) -> Message:
        content: list[ContentBlock] = []
        thought = tally.thought(0)
        if thought is not None:
            content.append(ThinkingBlock(thinking=thought, signature=sign(self.request, thought)))
        text = tally.text(0)
        if text.strip():  # whitespace alone is no answer (as in the stream: message_blocks.py)
            content.append(TextBlock(text=text))
        content += [
            ToolUseBlock(id=tool_use_id(c.id), name=c.name, input=_input("".join(c.arguments)))
            for c in tally.tool_calls(0)
        ]
        return Message(
            id=self.id,
            model=self.body.model,
            content=content,
            stop_reason=stop_reason(tally.finish.get(0), tally.stop_sequences.get(0)),
            stop_sequence=tally.stop_sequences.get(0),
            usage=self._usage(tally),
        )

    # --- streaming -----------------------------------------------------------------------------

    async def stream(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[Payload]:
        """message_start, the content blocks' events, message_delta (stop reason, usage),
        message_stop. The first event waits for the first delta, so a failure before it is
        still an HTTP error with its own status (server/serving/streaming.py)."""
        tally, blocks = Tally(), BlockStream(lambda thought: sign(self.request, thought))
        async with closing(deltas):  # a stalled reader's stream is closed at a `yield`
            async for index, delta in deltas:
                if not tally.texts:
                    yield self._start(delta)
                tally.add(index, delta)
                for item in blocks.push(delta):
                    yield item
        for item in blocks.close():
            yield item
        reason = stop_reason(tally.finish.get(0), tally.stop_sequences.get(0))
        end = MessageDeltaBody(stop_reason=reason, stop_sequence=tally.stop_sequences.get(0))
        yield event(MessageDeltaEvent(delta=end, usage=self._usage(tally)))
        yield event(MessageStopEvent())

    def _start(self, first: Delta) -> Event:
        usage = MessagesUsage.of(first.prompt_tokens, 0, first.cached_tokens)
        message = Message(id=self.id, model=self.body.model, content=[], stop_reason=None, usage=usage)
        return event(MessageStartEvent(message=message))


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object. Forced calls are grammar-constrained to the
    schema; only a call cut off by `max_tokens` (stop_reason says so) has none: `{}`."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class CountTokensServing(Serving[CountTokensRequest]):
    """The prompt's tokens after the chat template, tools included, as a create would see it."""

    endpoint: ClassVar[str] = "messages.count_tokens"
    task: ClassVar[Task | None] = "generate"

    def walk_images(self, see: ImageReader) -> None:
        self.body.to_engine_messages(see)

    async def respond(self) -> Response:
        model = self.resolve()
        body = self.body
        await self.read_images(model)
        result = await model.tokenize(
            TokenizeRequest(
                messages=body.to_engine_messages(self.see()),
                add_special_tokens=False,
                add_generation_prompt=True,
                tools=body.tools_spec(),
                thinking=body.thinking_switch()[0],
            )
        )
        return json_response(CountTokensResponse(input_tokens=len(result.tokens)))
