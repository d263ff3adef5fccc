"""The vLLM engine's request path in the gateway's terms, and back.

`VllmEngine` (engine.py) owns an AsyncLLM: its life (its restarts: supervisor.py) and which call
goes to it. Everything between a gateway request and that call is translation that needs the
model's tokenizer but not the engine: the prompt and chat turns as token ids (with their vocabulary
checks), a tokenize request's answer, a generate request as vLLM's `SamplingParams` (via
sampling_params.py's `to_vllm_sampling`), each streamed `RequestOutput` as a `Delta`, and vLLM's
finish reasons and validation errors as OpenAI's (embedding inputs and rerank pairs are
pooling.py's, the thinking settled at start-up thinking_setup.py's). It lives here so the engine
class reads as the engine and these pieces read (and change) on their own. Nothing here imports
vLLM: it runs in the replica on objects vLLM hands over.
"""

from __future__ import annotations

import secrets
from typing import Any

from raygate.backends.engines import reasoning, tool_calls
from raygate.backends.engines.base import check_token_ids, completion_budget
from raygate.backends.engines.deltas import DeltaBuilder
from raygate.backends.engines.images import content_parts, decode_rgb, has_images, place_images
from raygate.backends.engines.vllm.logprobs import TokenPieces, token_logprobs
from raygate.backends.engines.vllm.sampling_params import to_vllm_sampling
from raygate.backends.engines.vllm.thinking_track import THINKING_EXTRA_KEY, ThinkingTrack
from raygate.protocol.errors import BadRequestError, EngineError
from raygate.protocol.generation import (
    ChatMessage,
    Delta,
    FinishReason,
    GenerateRequest,
    TokenizeRequest,
    TokenizeResult,
    ToolsSpec,
)

# ---- requests -> token ids (run in a thread: tokenisers and Jinja templates are CPU work) -------

# Where an image goes in a turn's text until the template places the model's own image token (a
# marker no client can guess: a user's text that spells one stays text).
IMAGE_MARKER = f"<raygate-image-{secrets.token_hex(8)}>"


def prompt_ids(
    tokenizer: Any,
    request: GenerateRequest,
    vocab: int,
    thinks: reasoning.ReasoningFormat | None = None,
    gated: bool = False,
) -> tuple[list[int], reasoning.ThinkingPlan | None]:
    """A generate request's prompt as token ids: chat turns through the template, token ids as
    sent (checked against the vocabulary), or text; and for a chat with a reasoning model
    (`thinks`), its thinking (as the llama.cpp engine's `LlamaModel.prompt_and_thinking`).

    `gated`: vLLM can hold an output constraint (json_schema, a tool-call grammar) until the end
    marker (the engine's `reasoning_parser`, `reasoning_ended`); without that (markers that are not
    single tokens) a request with a constraint that would bind the thinking too is answered with
    thinking off. The budget is enforced by vLLM itself (`vllm_thinking_budget`)."""
    if request.messages is not None:
        text = chat_text(tokenizer, request.messages, request.tools, True, request.chat_template_kwargs())
        if thinks is None:
            return list(tokenizer.encode(text, add_special_tokens=False)), None
        constrained = request.sampling.constrained or tool_calls.forced(request.tools)
        off = request.thinking is False and reasoning.can_disable(thinks.parser)
        if off or (constrained and not gated):
            text += reasoning.closing_text(text, thinks.parser)
        end = list(tokenizer.encode(reasoning.end_marker(thinks.parser), add_special_tokens=False))
        plan = reasoning.ThinkingPlan(
            thinks.parser,
            reasoning.prompt_state(text, thinks.parser),
            thinks.budget_for(request.thinking_budget),
            end,
            request.include_reasoning,
        )
        return list(tokenizer.encode(text, add_special_tokens=False)), plan
    if isinstance(request.prompt, list):
        check_token_ids(request.prompt, vocab, "prompt")
        return list(request.prompt), None
    return list(tokenizer.encode(request.prompt or "", add_special_tokens=True)), None


def starts_thinking(plan: reasoning.ThinkingPlan | None) -> bool:
    """Whether the output begins inside the thinking: the prompt opened it, or the parser reads
    output without a `<think>` as thinking (`deepseek_r1`), or the answer is a channel of its own
    (gpt-oss's `harmony`: the grammar waits for the final channel's header). A `qwen3` output
    that may still open `<think>` (`before`) is answer as far as a constraint goes: its grammar
    applies from the first token, as on the llama.cpp engine."""
    if plan is None or plan.prompt == "closed":
        return False
    return plan.prompt == "open" or plan.parser in ("deepseek_r1", "harmony")


def thinking_args(
    plan: reasoning.ThinkingPlan | None, start: int, end: int, eos: list[int]
) -> dict[str, Any] | None:
    """`SamplingParams.extra_args` for thinking_end.py's logits processor: an end of generation
    drawn while thinking becomes the end marker `end` (one token). None when nothing may think."""
    if plan is None or plan.prompt == "closed":
        return None
    spec = {"start": start, "end": end, "eos": eos, "open": starts_thinking(plan)}
    return {THINKING_EXTRA_KEY: spec}


def chat_text(
    tokenizer: Any,
    messages: list[ChatMessage],
    tools: ToolsSpec | None,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The model's own chat template over the turns as `tool_calls.render_messages` writes
    them (tools in the system turn, earlier calls and tool results as text), so follow-up
    turns and tool results work with templates that know nothing of tools. `template_kwargs`:
    extra template variables (`enable_thinking`, vLLM's `chat_template_kwargs`)."""
    from jinja2 import TemplateError

    if not getattr(tokenizer, "chat_template", None):
        raise BadRequestError("This model has no chat template; use /v1/completions.", param="messages")
    placed, images = place_images(messages, IMAGE_MARKER) if has_images(messages) else (messages, [])
    turns: list[dict[str, Any]] = list(tool_calls.render_messages(placed, tools))
    if images:  # OpenAI-style parts: the model's template writes its image placeholder
        turns = [{**t, "content": content_parts(t["content"], IMAGE_MARKER)} for t in turns]
    try:
        text = tokenizer.apply_chat_template(
            turns,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **(template_kwargs or {}),
        )
    except (TemplateError, ValueError, TypeError) as exc:  # raise_exception(): bad turn order
        raise BadRequestError(f"Chat template rejected the messages: {exc}", param="messages") from None
    return str(text)


def image_data(request: GenerateRequest) -> dict[str, Any]:
    """vLLM's `multi_modal_data` (decoded images, in prompt order) and `multi_modal_uuids` (their
    digests: vLLM's processor and prefix caches key an image by it) for a chat with images.
    Blocking: decodes the images."""
    images = [image for m in request.messages or () for image in m.images]
    return {
        "multi_modal_data": {"image": [decode_rgb(image) for image in images]},
        "multi_modal_uuids": {"image": [image.digest for image in images]},
    }


def tokenize_request(
    tokenizer: Any,
    pieces: TokenPieces,
    request: TokenizeRequest,
    thinks: reasoning.ReasoningFormat | None,
    context: int,
) -> TokenizeResult:
    """A tokenize request's ids and their pieces: chat turns through the template (with thinking
    turned off closed as `prompt_ids` closes it), or text."""
    if request.messages is not None:
        switch = None if request.thinking is None else {"enable_thinking": request.thinking}
        text = chat_text(tokenizer, request.messages, request.tools, request.add_generation_prompt, switch)
        if (
            thinks is not None
            and request.thinking is False
            and request.add_generation_prompt
            and reasoning.can_disable(thinks.parser)
        ):
            text += reasoning.closing_text(text, thinks.parser)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    else:
        ids = list(tokenizer.encode(request.prompt or "", add_special_tokens=request.add_special_tokens))
    return TokenizeResult(ids, [pieces(t, None)[0] for t in ids], context)


# ---- a generate request -> vLLM's SamplingParams, its outputs -> Deltas ------------------------


# A batch line's priority is shifted by this: below every interactive request whatever either's
# `priority` (the API's range is a 32-bit int; vLLM's queue compares Python ints).
BACKGROUND_PRIORITY_OFFSET = 2**33


def vllm_priority(request: GenerateRequest) -> int:
    """The request's `priority` as vLLM's priority scheduler takes it (lower first): batch lines
    (`background`) after every interactive request, in their own `priority` order."""
    return request.priority + (BACKGROUND_PRIORITY_OFFSET if request.background else 0)


def generate_params(
    request: GenerateRequest,
    ids: list[int],
    context: int,
    vocab: int,
    thinking_budget: int | None = None,
    extra_args: dict[str, Any] | None = None,
) -> Any:
    """vLLM's `SamplingParams` for `request` over the (truncated) prompt `ids`, after the checks
    that need the model: token ids within the vocabulary, a non-empty prompt, a budget that fits.
    `thinking_budget`: vLLM's `thinking_token_budget` (`vllm_thinking_budget`); `extra_args`: the
    logits processors' (`thinking_args`)."""
    check_token_ids(request.sampling.stop_token_ids, vocab, "stop_token_ids")
    check_token_ids(request.sampling.allowed_token_ids or [], vocab, "allowed_token_ids")
    if not ids:
        raise BadRequestError("The prompt is empty.", param=request.prompt_param)
    budget = completion_budget(request, len(ids), context)
    return to_vllm_sampling(request.sampling, budget, request.tools, thinking_budget, extra_args)


def vllm_thinking_budget(
    plan: reasoning.ThinkingPlan | None, ids: list[int], start_ids: list[int]
) -> int | None:
    """The plan's budget as vLLM's `thinking_token_budget`, so that both engines force the end
    marker after the same number of generated tokens (llama.cpp's rule: `budget` tokens of
    thinking, the opening `<think>` the model writes included, then the marker).

    vLLM counts differently (vllm/v1/sample/thinking_budget_state.py): the tokens after the last
    `<think>` of the prompt count against the budget (the template's `\\n` after it), and one the
    model writes itself does not. So the first are added, and one taken off for the second. A
    prompt that closed the thinking needs no budget; a prompt with no `<think>` under the
    `deepseek_r1` parser (the output is thinking without one) gives vLLM nothing to count from,
    and is not bounded."""
    if plan is None or plan.budget is None or plan.prompt == "closed":
        return None
    if plan.prompt == "none":
        return max(plan.budget - 1, 0)
    n = len(start_ids)
    for at in range(len(ids) - n, -1, -1):
        if ids[at : at + n] == start_ids:
            return plan.budget + len(ids) - (at + n)
    return plan.budget  # `<think>` truncated away: vLLM counts only from one the model writes


class DeltaRelay:
    """One generate request's `RequestOutput`s (vLLM's DELTA kind: each carries only what is new)
    as `Delta`s. `read` takes an output's counts and logprobs and says how many tokens it brought;
    `delta` then makes its `Delta` (two steps, so the engine counts the tokens before a failed
    finish reason raises)."""

    def __init__(
        self,
        ids: list[int],
        request: GenerateRequest,
        pieces: TokenPieces,
        thinking: reasoning.ThinkingPlan | None = None,
        thinking_spec: dict[str, Any] | None = None,
    ) -> None:
        """`thinking_spec`: `thinking_args`'s, when the markers are single tokens: the thinking
        tokens are then counted by id (`ThinkingTrack`)."""
        self._ids, self._sampling, self._pieces = ids, request.sampling, pieces
        parser = tool_calls.ToolCallParser() if tool_calls.active(request.tools) else None
        self._out = DeltaBuilder(len(ids), parser, thinking)
        self._output: list[int] = []
        self._track = ThinkingTrack(thinking_spec, self._output) if thinking_spec is not None else None

    def read(self, result: Any) -> int:
        out, sampling, pieces = self._out, self._sampling, self._pieces
        piece = result.outputs[0]
        if result.prompt_token_ids:
            out.n_prompt = len(result.prompt_token_ids)
        if result.num_cached_tokens is not None:
            out.cached_tokens = result.num_cached_tokens
        if sampling.prompt_logprobs is not None and result.prompt_logprobs:
            out.prompt_logprobs = token_logprobs(
                pieces, self._ids, list(result.prompt_logprobs), sampling.prompt_logprobs
            )
        if sampling.logprobs is not None and piece.logprobs:
            out.logprobs += token_logprobs(
                pieces, list(piece.token_ids), list(piece.logprobs), sampling.logprobs
            )
        out.n_out += len(piece.token_ids)
        if self._track is not None:
            self._output.extend(piece.token_ids)
            self._track.read()
        return len(piece.token_ids)

    def delta(self, result: Any) -> Delta | None:
        piece = result.outputs[0]
        finish = _finish_reason(piece.finish_reason) if result.finished else None
        # vLLM's `stop_reason`: the stop string hit (str), a stop token id, or None.
        hit = piece.stop_reason if isinstance(piece.stop_reason, str) else None
        counted = self._track.counted if self._track is not None else None
        return self._out.delta(piece.text, finish, hit, counted)


# ---- vLLM's outcomes -> OpenAI's ---------------------------------------------------------------


def error_param(exc: Exception, request: GenerateRequest) -> str:
    """The request field a vLLM validation error is about, by OpenAI's names."""
    named = getattr(exc, "parameter", None)
    if named in ("logit_bias", "logprobs", "seed", "stop", "allowed_token_ids", "bad_words"):
        return str(named)
    if named == "prompt_logprobs":
        return "logprobs"
    if named == "structured_outputs" or "grammar" in str(exc).lower() or "schema" in str(exc).lower():
        if request.sampling.constrained:
            return tool_calls.constraint_param(request.sampling)
        if tool_calls.active(request.tools):
            return "tools"
    return request.prompt_param


def _finish_reason(reason: object) -> FinishReason:
    """vLLM's reasons as OpenAI's; its `error` (a request-level engine failure) is an error here."""
    text = str(reason)
    if text in ("stop", "length", "abort"):
        return text  # type: ignore[return-value]
    if text == "repetition":  # vLLM stopped a degenerate loop: the model chose to stop, in effect
        return "stop"
    raise EngineError(f"The engine failed this request ({text}); retry it.")
