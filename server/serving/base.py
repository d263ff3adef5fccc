"""The serving layer: what every endpoint does around the engine, written once.

A route handler builds the endpoint's serving object from the validated body and returns
`await serving.respond()`. The object lives for one request, so what the request needs while it
runs (its id, its model handle, per-choice templates and offsets) is plain attributes rather than
closures passed around.

`Serving` is the base of every endpoint that reaches a model: it names the endpoint (for the
unknown-field log and error messages) and the task a model must serve, and resolves the model
into an admitted `ModelHandle`, through which every engine call goes (admission wait, deadlines,
engine request ids, metrics: server/serving/handle.py).

`GenerationServing` adds the steps every generating endpoint shares, in this order:

1. resolve the model (404, 403, 400 for the wrong task or an unsupported field, 429 when full),
   and fill in the model's defaults (its `defaults:` over its `generation_config`) where the
   body leaves a sampling field unset;
2. turn the body into engine requests, one per sequence (`sequences`: n samples of each prompt),
   at most `--max-sequences` of them (`prompt_count` x n, checked before any is built: 400), and
   set the defaults the body has no field for (`SamplingDefaults.beyond`);
3. run them as one stream of `(choice index, Delta)` (server/serving/fanout.py `merge`);
4. stream it as server-sent events (server/serving/streaming.py `sse_response`: a failure before the first
   chunk is still an HTTP error, later ones travel in-band; a disconnect cancels the stream, which
   aborts the engine requests), or collect it into a `Tally` and render one body, answering 499
   when the client left first (the engine requests are aborted too).

Timeouts and metrics live in the handle, so they hold for every endpoint alike. A new generating
endpoint (the Responses API, Anthropic Messages) is a subclass that says how its body becomes
`GenerateRequest`s and how to render a delta as a chunk and a `Tally` as the final body.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import ClassVar, Generic, TypeVar

from fastapi import Request
from fastapi.responses import Response

from raygate.backends.streams import closing
from raygate.protocol.base import RequestModel, ResponseModel
from raygate.protocol.common import Usage
from raygate.protocol.config import Task
from raygate.protocol.generation import Delta, GenerateRequest, ImageInput
from raygate.protocol.images import ImageReader, ImageRefs, resolved
from raygate.server.serving.collect import CLIENT_CLOSED_REQUEST, collect
from raygate.server.serving.fanout import merge
from raygate.server.serving.handle import ModelHandle
from raygate.server.serving.ids import new_id
from raygate.server.serving.images import fetch_policy, read_images
from raygate.server.serving.resolve import resolve_model
from raygate.server.serving.sequence_cap import check_sequence_count
from raygate.server.serving.streaming import OPENAI_SSE, Payload, SseDialect, sse_response
from raygate.server.serving.tally import Tally

log = logging.getLogger(__name__)

BodyT = TypeVar("BodyT", bound=RequestModel)


def json_response(body: ResponseModel) -> Response:
    """A response model as the JSON body OpenAI clients expect (`omit_when_none` honoured)."""
    return Response(body.to_json(), media_type="application/json")


def sample_seed(seed: int | None, sample: int) -> int | None:
    """n samples with one seed must still differ from each other, and repeat across calls."""
    return None if seed is None else seed + sample


class Serving(ABC, Generic[BodyT]):
    """One request to an endpoint that reaches a model."""

    # The endpoint's name in the unknown-field log ("chat.completions").
    endpoint: ClassVar[str]
    # The task the model must serve (or one of several); None: any model will do (tokenizers).
    task: ClassVar[Task | tuple[Task, ...] | None]

    def __init__(self, body: BodyT, request: Request) -> None:
        self.body = body
        self.request = request

    def resolve(self) -> ModelHandle:
        """The admitted model, or the error response that refuses the request."""
        return resolve_model(self.request, self.endpoint, self.body, self.task)

    # --- images (docs/vision.md) ----------------------------------------------------------------

    images: dict[str, ImageInput] | None = None

    def walk_images(self, see: ImageReader) -> None:
        """Builds the body's engine turns with `see` as their image reader (the endpoint's own
        translation), so `read_images` learns every image and its field path; none by default."""

    async def read_images(self, model: ModelHandle) -> None:
        """Reads and checks every image of the body for `model` (400 naming the field, or the
        model when it is text-only) before anything reaches an engine."""
        refs = ImageRefs()
        self.walk_images(refs)
        policy = fetch_policy(self.request.app.state.settings)
        self.images = await read_images(refs.refs, model.config, policy)

    def see(self) -> ImageReader:
        """The reader `sequences` builds turns with: the images `read_images` read."""
        return resolved(self.images or {})

    @abstractmethod
    async def respond(self) -> Response:
        """The whole answer to the request."""


class GenerationServing(Serving[BodyT]):
    """One request to a generating endpoint: resolve, fan out, merge, stream or collect.

    Subclasses pass what the base reads from their body to `__init__` (whether to stream, how
    many samples each prompt gets, whether a stream ends with usage) and implement `sequences`,
    `stream` and `final_body`. An endpoint that streams one chunk per delta (OpenAI's chat and
    completions) subclasses `ChunkedServing`, which implements `stream` from per-delta hooks;
    one whose events open and close blocks (Responses, Anthropic Messages) writes `stream` itself.
    """

    task: ClassVar[Task | None] = "generate"
    # The id's prefix: "chatcmpl" gives `chatcmpl-<hex>`.
    id_prefix: ClassVar[str]
    # The field that holds several prompts, named by the sequence cap's 400 (one prompt: `n`).
    prompts_param: ClassVar[str] = "n"
    # How the stream reports a late failure and ends (OpenAI's `data: [DONE]`, or Anthropic's).
    sse_dialect: ClassVar[SseDialect] = OPENAI_SSE

    def __init__(
        self,
        body: BodyT,
        request: Request,
        *,
        stream: bool,
        samples_per_prompt: int,
        include_usage: bool,
        user: str | None = None,
    ) -> None:
        super().__init__(body, request)
        self.streaming = stream
        self.samples_per_prompt = samples_per_prompt
        self.include_usage = include_usage
        self.user = user
        self.id = new_id(self.id_prefix)
        self.created = int(time.time())

    # --- what a subclass says ------------------------------------------------------------------

    @abstractmethod
    def sequences(self) -> list[GenerateRequest]:
        """The engine requests, in choice order (prompt-major: prompt p's sample i is choice
        `p * samples_per_prompt + i`). Called after the model is resolved, so a refusal of the
        body (an `OpenAIError`) comes after "no such model", as OpenAI orders them."""

    def prompt_count(self) -> int:
        """How many prompts the body holds (each gets `samples_per_prompt` sequences); an endpoint
        that takes several prompts says so here, so the cap is checked before `sequences`."""
        return 1

    @abstractmethod
    def stream(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[Payload]:
        """The SSE payloads of a streamed answer, from the merged `(choice index, Delta)` stream
        (closed by the caller's disconnect: close `deltas` with `closing`)."""

    @abstractmethod
    def final_body(self, tally: Tally, choices: int) -> ResponseModel:
        """The non-streamed body, from every choice's collected deltas."""

    def observe(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[tuple[int, Delta]]:
        """The merged stream, for an endpoint that watches it pass (Ollama's timings); as it is."""
        return deltas

    async def streamed(self, payloads: AsyncIterator[Payload]) -> Response:
        """The streamed response of `payloads`: server-sent events in the endpoint's dialect."""
        return await sse_response(payloads, self.request, self.sse_dialect)

    # --- what the base does --------------------------------------------------------------------

    def sequence_id(self, index: int) -> str:
        """The engine request id of choice `index` (the handle prefixes the HTTP request id)."""
        return f"{self.id}-{index}"

    def usage(self, tally: Tally) -> Usage:
        return Usage.of(*tally.usage_counts(self.samples_per_prompt), tally.thinking_tokens())

    def sampled_sequences(self, model: ModelHandle) -> list[GenerateRequest]:
        """`sequences()` under the model's sampling defaults (its `defaults:` over its generation
        config), within the gateway's sequence cap. Every generating endpoint's requests come from
        here, so no endpoint decodes without the defaults its model was deployed with."""
        limit = self.request.app.state.settings.max_sequences
        check_sequence_count(self.prompt_count(), self.samples_per_prompt, limit, self.prompts_param)
        defaults = model.sampling_defaults()
        self.body = defaults.under(self.body)
        requests = self.sequences()
        if len(requests) > limit:  # an endpoint whose `prompt_count` undercounts
            check_sequence_count(len(requests), 1, limit, self.prompts_param)
        for r in requests:
            defaults.beyond(self.body, r.sampling)
        return requests

    async def respond(self) -> Response:
        model = self.resolve()
        if self.user:
            log.debug("%s for user %r", self.id, self.user)
        await self.read_images(model)
        requests = self.sampled_sequences(model)
        spp = self.samples_per_prompt
        deltas = self.observe(
            merge([model.generate(r, counts_prompt=i % spp == 0) for i, r in enumerate(requests)])
        )
        if self.streaming:
            return await self.streamed(self.stream(deltas))
        tally = await collect(self.request, deltas)
        if tally is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return json_response(self.final_body(tally, len(requests)))


class ChunkedServing(GenerationServing[BodyT]):
    """A generating endpoint whose stream is one chunk per delta (OpenAI's chat and completions):
    an optional opening chunk per choice, a chunk per delta, and usage last when asked for."""

    def opening_chunk(self, index: int) -> str | None:
        """A chunk sent before choice `index`'s first delta (chat announces the role); None: none."""
        return None

    @abstractmethod
    def delta_chunk(self, index: int, delta: Delta, first: bool) -> str | None:
        """The chunk for one delta of choice `index` (`first`: its first), or None to send none.
        This runs once per token: keep it on a `TextTemplate` for plain text (protocol/templates)."""

    @abstractmethod
    def usage_chunk(self, usage: Usage) -> str:
        """The last chunk of a stream that asked for usage (`stream_options.include_usage`)."""

    async def stream(self, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[Payload]:
        """Per delta its chunk (after the choice's opening chunk), then usage."""
        tally = Tally()
        async with closing(deltas):  # a stalled reader's stream is closed at a `yield`
            async for index, delta in deltas:
                first = index not in tally.texts
                if first:
                    opening = self.opening_chunk(index)
                    if opening is not None:
                        yield opening
                tally.add(index, delta)
                chunk = self.delta_chunk(index, delta, first)
                if chunk is not None:
                    yield chunk
        if self.include_usage:
            yield self.usage_chunk(self.usage(tally))
