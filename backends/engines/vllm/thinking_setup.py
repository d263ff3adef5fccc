"""What a reasoning model's thinking needs from vLLM, settled at each engine start.

Two steps around the engine's construction: before it, the parser is picked (`auto` read from the
folder's chat template) and its markers, reasoning parser and logits processor go into the engine
arguments (`with_thinking`); after it, the loaded tokenizer gives the thinking's format, its markers
as token ids and the model's end-of-generation tokens (`thinking_setup`), which every generate
request then reads. A room of its own so engine.py's start-up reads as the engine's, and a rebuilt
engine (after an EngineCore death) gets the same setup by the same two calls. Nothing here imports
vLLM at module level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raygate.backends.engines import reasoning
from raygate.backends.engines.reasoning import START, ReasoningFormat, detect, markers
from raygate.backends.engines.vllm import engine_args
from raygate.protocol.capabilities import ReasoningConfig


@dataclass(frozen=True)
class ThinkingSetup:
    """A started engine's thinking, as every generate request reads it (`thinking_setup`)."""

    thinks: ReasoningFormat | None = None  # resolved against the chat template at start
    # `<think>` as tokens: where vLLM counts the budget from
    start_ids: list[int] = field(default_factory=list)
    # `<think>` and `</think>` when each is one token: then a grammar waits for the end marker
    # and an end of generation while thinking becomes it (else: thinking off under a grammar).
    markers: tuple[int, int] | None = None
    gated: bool = False  # a grammar may wait for the end of thinking (`thinking_setup`)
    eos: list[int] = field(default_factory=list)  # the model's end-of-generation tokens


def with_thinking(kwargs: dict[str, Any], config: ReasoningConfig | None) -> tuple[dict[str, Any], bool]:
    """The engine arguments `kwargs` (a copy) with what a reasoning model needs, and whether the
    engine's grammar gate is harmony_gate.py's."""
    kwargs = dict(kwargs)
    if config is None or config.parser == "none":
        return kwargs, False
    # vLLM's sampler enforces thinking budgets, holds grammars until the end marker and
    # (thinking_end.py) keeps a thinking model from ending its turn; no vLLM reasoning
    # parser reaches the output: the split is Raygate's (reasoning.py).
    # gpt-oss's harmony: its multi-token markers for the budget, and its own grammar gate
    # (harmony_gate.py: the final channel's header, not one `</think>` token).
    parser = config.parser
    if parser == "auto":  # read from the folder's template now: the markers are made here
        parser = detect(engine_args.folder_chat_template(kwargs["model"])) or "auto"
    start, end = markers(parser)
    harmony_gate = start != START
    return engine_args.with_reasoning(kwargs, start, end, harmony=harmony_gate), harmony_gate


def thinking_setup(
    tokenizer: Any, config: ReasoningConfig | None, harmony_gate: bool, generation_config: dict[str, Any]
) -> ThinkingSetup:
    """The thinking of an engine built with `with_thinking`'s arguments, read from its tokenizer
    and generation config."""
    thinks = reasoning.resolve(config, getattr(tokenizer, "chat_template", None))
    start = markers(thinks.parser)[0] if thinks is not None else START
    harmony = thinks is not None and thinks.parser == "harmony"
    single = single_token_markers(tokenizer) if thinks and not harmony else None
    # Whether a grammar can wait for the thinking to end: `</think>` as one token, or the
    # harmony gate (only when the spec named the parser: the engine's gate is set up before
    # the template is read, so `auto` on a harmony template answers constrained requests
    # with an empty analysis channel).
    return ThinkingSetup(
        thinks=thinks,
        start_ids=list(tokenizer.encode(start, add_special_tokens=False)),
        markers=single,
        gated=single is not None or (harmony and harmony_gate),
        eos=end_of_generation(tokenizer, generation_config),
    )


def single_token_markers(tokenizer: Any) -> tuple[int, int] | None:
    """`<think>` and `</think>` as one token each, or None. vLLM's structured-output manager and
    thinking_end.py's processor see the thinking end by the marker's token id, so both need it
    whole (reasoning models' tokenizers have them as added tokens)."""
    start = list(tokenizer.encode(reasoning.START, add_special_tokens=False))
    end = list(tokenizer.encode(reasoning.END, add_special_tokens=False))
    return (start[0], end[0]) if len(start) == 1 and len(end) == 1 else None


def end_of_generation(tokenizer: Any, generation_config: dict[str, Any]) -> list[int]:
    """The tokens that end the model's turn: the tokenizer's EOS and the generation config's
    `eos_token_id` (one id or a list), as vLLM stops on them."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    more = generation_config.get("eos_token_id")
    ids.update([more] if isinstance(more, int) else list(more or []))
    return sorted(int(i) for i in ids)
