"""The request's sampling parameters as vLLM's `SamplingParams`, with OpenAI's semantics, and the
guided decoding (xgrammar structural tags) for `response_format` and tool calls. One request's
mapping, made in the replica for each request; the engine-wide arguments are engine_args.py's.

vLLM is imported inside the functions only: `backends/` is imported by the gateway process, which
must not load an engine library (or need it installed).
"""

from __future__ import annotations

import json
from typing import Any

from raygate.backends.engines import tool_calls
from raygate.protocol.generation import SamplingParams, ToolsSpec


def to_vllm_sampling(
    sampling: SamplingParams,
    max_tokens: int,
    tools: ToolsSpec | None = None,
    thinking_budget: int | None = None,
    extra_args: dict[str, Any] | None = None,
) -> Any:
    """The request's sampling parameters as vLLM's, with OpenAI's semantics.

    * `n` is always 1: the gateway runs each of a request's `n` samples as its own sequence (with
      seed + i), so they spread over replicas and stream independently.
    * vLLM's own extensions (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`,
      `stop_token_ids`, `bad_words` ...) map one to one; `top_k` off is vLLM's 0. Defaults are
      already in: the gateway fills unset fields from the deployment's `defaults:` over the
      model's `generation_config.json` (read by the replica, backends/engines/model_files.py), as
      vLLM's own server does; vLLM's engine applies none itself.
    * `min_tokens` is capped at the budget (vLLM refuses more than `max_tokens`, and the budget
      may be below what the client asked when the context is short).
    * `DELTA` output: each `RequestOutput` carries only the new text and token ids, which is what
      a stream needs; stop strings are held back by vLLM until decided, so none leaks.
    * Logprobs are vLLM's default `raw_logprobs` (before bias, penalties, grammar and temperature),
      the same quantity the llama.cpp engine reports; `logit_bias` is added to the logits, as
      OpenAI and llama.cpp do.
    * `thinking_budget` is vLLM's own `thinking_token_budget`: after that many thinking tokens its
      sampler forces the end marker (the engine's `reasoning_config` names the markers).
    * `extra_args`: per-request arguments of the engine's own logits processors (thinking_end.py).
    """
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    constraint = structured_outputs(sampling, tools)
    # As on llama.cpp: a grammar's end is never held off. Ignoring EOS (or requiring more tokens)
    # past a complete grammar would let vLLM write on outside it.
    hold_eos = constraint is None
    return VllmSamplingParams(
        n=1,
        max_tokens=max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k_limit or 0,
        min_p=sampling.min_p,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        ignore_eos=sampling.ignore_eos and hold_eos,
        min_tokens=min(sampling.min_tokens, max_tokens) if hold_eos else 0,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        allowed_token_ids=sampling.allowed_token_ids,
        bad_words=list(sampling.bad_words) or None,
        logprobs=sampling.logprobs,
        prompt_logprobs=sampling.prompt_logprobs,
        logit_bias=sampling.logit_bias or None,
        structured_outputs=constraint,
        output_kind=RequestOutputKind.DELTA,
        skip_special_tokens=sampling.skip_special_tokens,
        thinking_token_budget=thinking_budget,
        extra_args=extra_args,
    )


# The JSON both engines may write. Unbounded, a small model can spend its whole budget inside a
# valid object, on newlines or on the digits of one integer; llama-cpp-python's JSON grammars
# allow one space between tokens and 16 digits per integer, and so does this.
JSON_WHITESPACE = 1
JSON_INTEGER_LIMIT = 10**16 - 1
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})  # values, not schemas


def structured_outputs(sampling: SamplingParams, tools: ToolsSpec | None) -> Any:
    """Guided decoding (vLLM's structured outputs, on xgrammar) for `response_format` and tool
    calls, or None. Always an xgrammar structural tag, because only there is whitespace bounded
    per request (vLLM's own switch for it is engine-wide).

    Tool calls use the same text format and call schema as the llama.cpp engine's grammar
    (`backends/engines/tool_calls.py`): with `auto` the model writes freely until it opens `<tool_call>`,
    and from there the call must parse (a *triggered* tag); with `required` or a named function
    the whole output is call blocks, back to back, at least one (exactly one without parallel
    calls), as in the llama.cpp grammar.
    """
    from vllm.sampling_params import StructuredOutputsParams

    tool_calls.refuse_schema_with_tools(sampling, tools, "vllm")
    if sampling.regex is not None or sampling.choice is not None or sampling.grammar is not None:
        # vLLM's own structured outputs: xgrammar compiles the regex, choice list or GBNF grammar.
        return StructuredOutputsParams(regex=sampling.regex, choice=sampling.choice, grammar=sampling.grammar)
    fmt: dict[str, Any]
    if sampling.json_schema is not None:
        fmt = _json(sampling.json_schema)
    elif tool_calls.active(tools):
        assert tools is not None
        tag = {
            "type": "tag",
            "begin": tool_calls.OPEN + "\n",
            "content": _json(tool_calls.call_schema(tools.offered())),
            "end": "\n" + tool_calls.CLOSE,
        }
        if tool_calls.forced(tools):
            fmt = {"type": "plus", "content": tag} if tools.parallel else tag
        else:
            fmt = {
                "type": "triggered_tags",
                "triggers": [tool_calls.OPEN],
                "tags": [tag],
                "stop_after_first": not tools.parallel,
            }
    else:
        return None
    return StructuredOutputsParams(structural_tag=json.dumps({"type": "structural_tag", "format": fmt}))


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": _bounded_integers(schema),
        "max_whitespace_cnt": JSON_WHITESPACE,
    }


def _bounded_integers(node: Any) -> Any:
    """The schema with every integer that has no bound of its own limited to 16 digits."""
    if isinstance(node, list):
        return [_bounded_integers(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in _DATA_KEYWORDS else _bounded_integers(v) for k, v in node.items()}
    if out.get("type") == "integer":
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -JSON_INTEGER_LIMIT
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = JSON_INTEGER_LIMIT
    return out
