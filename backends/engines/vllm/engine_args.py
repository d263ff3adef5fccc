"""vLLM's engine arguments for one replica: a spec's `engine:` block checked and completed with what
the replica sets itself, and, for a reasoning model, the markers, parser and logits processor
vLLM's EngineCore needs. Built before any engine process starts, so a config that cannot work
fails the replica's start with a message naming the key; kept apart from the request path
(translate.py), which runs for every request on an engine these arguments already made.

Nothing here imports vLLM at module level: `backends/` is imported by the gateway process, which
must not load an engine library (or need it installed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Our stat logger (stats.py) is vLLM's way to see its scheduler; with it, vLLM's own periodic log
# lines and Prometheus registry would be extra work per step, so they are off unless asked for.
# `scheduling_policy: priority`: vLLM's waiting queue ordered by each request's priority (lower
# first, then arrival; `translate.vllm_priority`), and a running request of the worst priority is
# the one preempted when KV blocks run out. A config's `engine: {scheduling_policy: fcfs}` turns
# it off (vLLM then ignores the priorities).
DEFAULT_ENGINE_KWARGS: dict[str, Any] = {"disable_log_stats": True, "scheduling_policy": "priority"}

# A reasoning model's thinking on vLLM (docs/reasoning.md): the logits processor that turns an end
# of generation drawn while thinking into the end marker (thinking_end.py, loaded by vLLM's
# EngineCore by name), and the vLLM reasoning parser its structured-output manager uses to start a
# grammar after `</think>` (whose markers, one token each, are Raygate's: the split itself is
# reasoning.py's). The `SamplingParams.extra_args` key a request opts in with is thinking_track.py's.
THINKING_END_PROCESSOR = "raygate.backends.engines.vllm.thinking_end:ThinkingEndProcessor"
GRAMMAR_REASONING_PARSER = "deepseek_r1"
# gpt-oss's harmony: the parser that starts a grammar at the final channel (harmony_gate.py),
# registered in the EngineCore by importing its module (vLLM's `reasoning_parser_plugin`).
HARMONY_GATE_PARSER = "raygate_harmony"
HARMONY_GATE_PLUGIN = "raygate.backends.engines.vllm.harmony_gate"

# Keys the replica sets itself, from other parts of the model config.
RESERVED_ENGINE_KWARGS = frozenset({"model", "tokenizer", "runner"})


def engine_kwargs(
    model_path: str, *, embedding: bool, user_kwargs: dict[str, Any], num_gpus: float
) -> dict[str, Any]:
    """`AsyncEngineArgs` keyword arguments for one replica; refuses a config that cannot work.

    Checked here, before any process starts, so a wrong config fails the replica's start with a
    message that names the key (vLLM would fail later, or hang waiting for GPUs Ray never gave).
    """
    reserved = RESERVED_ENGINE_KWARGS & set(user_kwargs)
    if reserved:
        raise ValueError(
            f"engine keys {sorted(reserved)} are set from the model config (`source`, `task`); "
            "remove them from `engine`"
        )
    world = int(user_kwargs.get("tensor_parallel_size", 1)) * int(
        user_kwargs.get("pipeline_parallel_size", 1)
    )
    if num_gpus and world > num_gpus:
        raise ValueError(
            f"tensor_parallel_size x pipeline_parallel_size = {world} GPUs per replica, but the "
            f"replica reserves num_gpus: {num_gpus:g}; set num_gpus: {world}"
        )
    kwargs = {
        **DEFAULT_ENGINE_KWARGS,
        **user_kwargs,
        "model": model_path,
        "tokenizer": model_path,
        "runner": "pooling" if embedding else "generate",
    }
    if world > 1:
        # Inside a Ray actor vLLM would otherwise try to build its own Ray placement group; the
        # GPUs Ray gave this actor are already visible to it, so plain worker processes suffice.
        kwargs.setdefault("distributed_executor_backend", "mp")
    return kwargs


def folder_chat_template(folder: str) -> str | None:
    """The chat template a Hugging Face folder ships (`chat_template.jinja`, else
    `tokenizer_config.json`'s `chat_template`: one string, or named ones of which `default`), read
    before vLLM starts: a reasoning parser `auto` must know gpt-oss's markers when the engine's
    reasoning config is made, not after its tokenizer is loaded."""
    root = Path(folder).expanduser()
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template") if isinstance(config, dict) else None
    except (OSError, ValueError):
        return None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def with_reasoning(kwargs: dict[str, Any], start: str, end: str, harmony: bool = False) -> dict[str, Any]:
    """`AsyncEngineArgs` keyword arguments for a reasoning model: the markers named for vLLM's
    thinking budget (`reasoning_config`), a reasoning parser for its structured outputs (a
    grammar waits for the end of thinking on a request that says its reasoning has not ended:
    `</think>`, or with `harmony` the final channel's header, harmony_gate.py), and the logits
    processor that keeps a thinking model from ending its turn (thinking_end.py).
    What the config's `engine:` block sets itself is kept."""
    from vllm.config.reasoning import ReasoningConfig as VllmReasoningConfig
    from vllm.config.structured_outputs import StructuredOutputsConfig

    out = dict(kwargs)
    out.setdefault("reasoning_config", VllmReasoningConfig(reasoning_start_str=start, reasoning_end_str=end))
    gate: dict[str, str] = (
        {"reasoning_parser": HARMONY_GATE_PARSER, "reasoning_parser_plugin": HARMONY_GATE_PLUGIN}
        if harmony
        else {"reasoning_parser": GRAMMAR_REASONING_PARSER}
    )
    outputs = out.get("structured_outputs_config")
    if outputs is None:
        out["structured_outputs_config"] = StructuredOutputsConfig(**gate)
    elif isinstance(outputs, dict):
        out["structured_outputs_config"] = StructuredOutputsConfig(**{**gate, **outputs})
    processors = list(out.get("logits_processors") or [])
    if THINKING_END_PROCESSOR not in processors:
        out["logits_processors"] = [*processors, THINKING_END_PROCESSOR]
    return out
