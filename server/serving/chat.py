"""`ChatServing`: `POST /v1/chat/completions` on the serving base."""

from __future__ import annotations

from typing import ClassVar

from fastapi import Request

from raygate.protocol.chat import (
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatDelta,
)
from raygate.protocol.common import Usage
from raygate.protocol.generation import Delta, GenerateRequest, ToolCallDelta
from raygate.protocol.images import ImageReader
from raygate.protocol.templates import TextTemplate, text_marker
from raygate.protocol.tools import (
    ChoiceLogprobs,
    FunctionCallChunk,
    FunctionCallOut,
    ToolCallChunk,
    ToolCallOut,
)
from raygate.server.serving.base import ChunkedServing, sample_seed
from raygate.server.serving.tally import Tally


class ChatServing(ChunkedServing[ChatCompletionRequest]):
    """n samples of one conversation; chunks carry content, tool-call pieces and logprobs."""

    endpoint: ClassVar[str] = "chat.completions"
    id_prefix: ClassVar[str] = "chatcmpl"

    def __init__(self, body: ChatCompletionRequest, request: Request) -> None:
        super().__init__(
            body,
            request,
            stream=body.stream,
            samples_per_prompt=body.n,
            include_usage=body.include_usage,
            user=body.user,
        )
        self._logprobs = body.logprobs
        self._marker = text_marker()
        self._templates: dict[int, TextTemplate] = {}

    def walk_images(self, see: ImageReader) -> None:
        self.body.to_engine_messages(see)

    def sequences(self) -> list[GenerateRequest]:
        body = self.body
        messages, tools = body.to_engine_messages(self.see()), body.tools_spec()
        thinking, budget, kwargs = body.thinking()
        requests = []
        for i in range(body.n):
            sampling = body.to_sampling_params()
            sampling.seed = sample_seed(sampling.seed, i)
            requests.append(
                GenerateRequest(
                    self.sequence_id(i),
                    sampling,
                    messages=messages,
                    tools=tools,
                    thinking=thinking,
                    thinking_budget=budget,
                    template_kwargs=kwargs,
                    include_reasoning=body.include_reasoning,
                )
            )
        return requests

    def final_body(self, tally: Tally, choices: int) -> ChatCompletion:
        return ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.body.model,
            choices=[self._choice(tally, i) for i in range(choices)],
            usage=self.usage(tally),
        )

    def _choice(self, tally: Tally, i: int) -> ChatCompletionChoice:
        calls = [
            ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments="".join(c.arguments)))
            for c in tally.tool_calls(i)
        ]
        content: str | None = tally.text(i)
        if calls and not (content or "").strip():
            content = None  # OpenAI sends null content next to tool calls
        thought = tally.thought(i)
        return ChatCompletionChoice(
            index=i,
            message=ChatCompletionMessage(
                content=content, tool_calls=calls or None, reasoning_content=thought, reasoning=thought
            ),
            logprobs=ChoiceLogprobs.of(tally.logprobs.get(i, [])) if self.body.logprobs else None,
            finish_reason=tally.finish.get(i),
        )

    # --- streaming -----------------------------------------------------------------------------

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> str:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.body.model, choices=choices, usage=usage
        ).to_json()

    def _text_template(self, index: int) -> TextTemplate:
        """The per-token chunk's template, made of the same model (see protocol/templates)."""
        model = ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.body.model,
            choices=[ChatChunkChoice(index=index, delta=ChatDelta(content=self._marker))],
        )
        template = self._templates[index] = TextTemplate(model, self._marker)
        return template

    def opening_chunk(self, index: int) -> str:
        """A choice's first chunk announces the role, as OpenAI's do."""
        return self._chunk([ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))])

    def delta_chunk(self, index: int, delta: Delta, first: bool) -> str | None:
        content = delta.text or None
        thought = delta.reasoning or None
        calls = _call_chunks(delta.tool_calls) if delta.tool_calls else None
        logprobs = ChoiceLogprobs.of(delta.logprobs) if self._logprobs and delta.logprobs else None
        plain = thought is None and delta.finish_reason is None and not calls and logprobs is None
        if plain:
            # The per-token path: one template render, nothing built (see protocol/templates).
            # Empty text too: a token whose text is not out yet (backends/engines/deltas.py).
            template = self._templates.get(index) or self._text_template(index)
            return template.render(delta.text)
        return self._chunk(
            [
                ChatChunkChoice(
                    index=index,
                    delta=ChatDelta(
                        content=content, reasoning_content=thought, reasoning=thought, tool_calls=calls
                    ),
                    logprobs=logprobs,
                    finish_reason=delta.finish_reason,
                )
            ]
        )

    def usage_chunk(self, usage: Usage) -> str:
        return self._chunk([], usage)


def _call_chunks(pieces: list[ToolCallDelta]) -> list[ToolCallChunk]:
    """The first piece of a call names it; every piece carries `index` (clients key on it)."""
    return [
        ToolCallChunk(
            index=p.index,
            id=p.id,
            type="function" if p.id is not None else None,
            function=FunctionCallChunk(name=p.name, arguments=p.arguments),
        )
        for p in pieces
    ]
