"""`CompletionServing`: `POST /v1/completions` on the serving base."""

from __future__ import annotations

from typing import ClassVar

from fastapi import Request

from raygate.protocol.common import Usage
from raygate.protocol.completions import Completion, CompletionChoice, CompletionRequest
from raygate.protocol.errors import UnsupportedParameterError
from raygate.protocol.generation import Delta, GenerateRequest, TokenLogprob
from raygate.protocol.templates import TextTemplate, text_marker
from raygate.protocol.tools import CompletionLogprobs
from raygate.server.serving.base import ChunkedServing, sample_seed
from raygate.server.serving.tally import Tally


class CompletionServing(ChunkedServing[CompletionRequest]):
    """n samples of each of several prompts; `echo` puts the prompt in front of its choices' text."""

    endpoint: ClassVar[str] = "completions"
    id_prefix: ClassVar[str] = "cmpl"
    prompts_param: ClassVar[str] = "prompt"

    def __init__(self, body: CompletionRequest, request: Request) -> None:
        super().__init__(
            body,
            request,
            stream=body.stream,
            samples_per_prompt=body.n,
            include_usage=body.include_usage,
            user=body.user,
        )
        self._echoes: list[str] = []
        # Characters of each choice's text sent so far: `text_offset` of its next logprobs.
        self._offsets: dict[int, int] = {}
        self._marker = text_marker()
        self._templates: dict[int, TextTemplate] = {}

    def prompt_count(self) -> int:
        return len(self.body.prompts())

    def sequences(self) -> list[GenerateRequest]:
        body = self.body
        prompts: list[str | list[int]] = list(body.prompts())
        if body.echo and any(not isinstance(p, str) for p in prompts):
            raise UnsupportedParameterError("`echo` works with text prompts only.", param="echo")
        if body.echo and body.suffix is not None:
            raise UnsupportedParameterError("`echo` cannot be combined with `suffix`.", param="suffix")
        requests = []
        for p, prompt in enumerate(prompts):
            for i in range(body.n):
                sampling = body.to_sampling_params()
                sampling.seed = sample_seed(sampling.seed, i)
                request_id = self.sequence_id(p * body.n + i)
                requests.append(GenerateRequest(request_id, sampling, prompt=prompt, suffix=body.suffix))
        self._echoes = [p if body.echo and isinstance(p, str) else "" for p in prompts]
        return requests

    def _logprobs(self, entries: list[TokenLogprob], start: int) -> CompletionLogprobs | None:
        """`text_offset` counts characters into the choice's `text` (the echoed prompt included)."""
        return CompletionLogprobs.of(entries, start) if self.body.logprobs is not None else None

    def final_body(self, tally: Tally, choices: int) -> Completion:
        n = self.body.n
        return Completion(
            id=self.id,
            created=self.created,
            model=self.body.model,
            choices=[
                CompletionChoice(
                    index=i,
                    text=self._echoes[i // n] + tally.text(i),
                    logprobs=self._logprobs(tally.prompt_logprobs.get(i, []) + tally.logprobs.get(i, []), 0),
                    finish_reason=tally.finish.get(i),
                )
                for i in range(choices)
            ],
            usage=self.usage(tally),
        )

    # --- streaming -----------------------------------------------------------------------------

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        return Completion(
            id=self.id, created=self.created, model=self.body.model, choices=choices, usage=usage
        ).to_json()

    def _text_template(self, index: int) -> TextTemplate:
        """The per-token chunk's template, made of the same model (see protocol/templates)."""
        choice = CompletionChoice(index=index, text=self._marker, finish_reason=None)
        model = Completion(id=self.id, created=self.created, model=self.body.model, choices=[choice])
        template = self._templates[index] = TextTemplate(model, self._marker)
        return template

    def delta_chunk(self, index: int, delta: Delta, first: bool) -> str | None:
        echo = self._echoes[index // self.body.n] if first else ""
        entries = (delta.prompt_logprobs or []) + (delta.logprobs or [])
        offset = self._offsets.get(index, 0)
        logprobs = self._logprobs(entries, offset) if entries else None
        self._offsets[index] = offset + sum(len(e.token) for e in entries)
        if not echo and delta.finish_reason is None and logprobs is None:
            # The per-token path: one template render, nothing built (see protocol/templates).
            # Empty text too: a token whose text is not out yet (backends/engines/deltas.py).
            template = self._templates.get(index) or self._text_template(index)
            return template.render(delta.text)
        return self._chunk(
            [
                CompletionChoice(
                    index=index,
                    text=echo + delta.text,
                    logprobs=logprobs,
                    finish_reason=delta.finish_reason,
                )
            ]
        )

    def usage_chunk(self, usage: Usage) -> str:
        return self._chunk([], usage)
