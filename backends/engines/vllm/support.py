"""What the vLLM engine needs besides the request path: engine arguments, the sampling mapping,
and the counters read off vLLM's own scheduler.

Nothing here imports vLLM at module level: `backends/` is imported by the gateway process, which
must not load an engine library (or need it installed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raygate.backends.engines import tool_calls
from raygate.backends.engines.base import EngineStats
from raygate.protocol.generation import SamplingParams, TokenLogprob, ToolsSpec, TopLogprob

# Our stat logger below is vLLM's way to see its scheduler; with it, vLLM's own periodic log
# lines and Prometheus registry would be extra work per step, so they are off unless asked for.
# `scheduling_policy: priority`: vLLM's waiting queue ordered by each request's priority (lower
# first, then arrival; `translate.vllm_priority`), and a running request of the worst priority is
# the one preempted when KV blocks run out. A config's `engine: {scheduling_policy: fcfs}` turns
# it off (vLLM then ignores the priorities).
DEFAULT_ENGINE_KWARGS: dict[str, Any] = {"disable_log_stats": True, "scheduling_policy": "priority"}

# A reasoning model's thinking on vLLM (docs/reasoning.md): the logits processor that turns an end
# of generation drawn while thinking into the end marker (thinking_end.py, loaded by vLLM's
# EngineCore by name), the `SamplingParams.extra_args` key a request opts in with, and the vLLM
# reasoning parser its structured-output manager uses to start a grammar after `</think>` (whose
# markers, one token each, are Raygate's: the split itself is reasoning.py's).
THINKING_END_PROCESSOR = "raygate.backends.engines.vllm.thinking_end:ThinkingEndProcessor"
THINKING_EXTRA_KEY = "raygate_thinking"
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


class ThinkingTrack:
    """Where one request's output stands in its thinking, read by token id as it grows (thinking_end.py;
    `tokens` is vLLM's live output list): `before` a `<think>` the model may open, `thinking`
    until the end marker, then `answer`. `spec` is `translate.thinking_args`'s. `counted`: the
    thinking tokens so far (the `<think>` that opened it and the end marker included), exact
    however many tokens one of vLLM's outputs brings (the text split cannot tell them apart)."""

    __slots__ = ("counted", "end", "eos", "seen", "start", "state", "tokens")

    def __init__(self, spec: dict[str, Any], tokens: list[int]) -> None:
        self.start = int(spec["start"])
        self.end = int(spec["end"])
        self.eos = [int(t) for t in spec["eos"] if int(t) != self.end]
        self.tokens = tokens
        self.seen = 0
        self.counted = 0
        self.state = "thinking" if spec["open"] else "before"

    def read(self) -> str:
        """Reads the tokens since the last call; the state the next token is drawn in."""
        tokens, n = self.tokens, len(self.tokens)
        while self.seen < n and self.state != "answer":
            token = tokens[self.seen]
            if self.state == "before":
                self.state = "thinking" if token == self.start else "answer"
            elif token == self.end:
                self.state = "answer"
            self.counted += self.state == "thinking" or token == self.end
            self.seen += 1
        return self.state


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


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: how byte-level tokenizers (GPT-2,
    Llama 3, Qwen, SmolLM ...) spell arbitrary bytes as printable characters in their vocabulary."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenPieces:
    """A token id's raw bytes and text, for logprobs.

    vLLM reports a decoded string per token; a token holding half of a UTF-8 character decodes to
    a replacement character there, while OpenAI's `bytes` field is meant to carry the real bytes.
    So for byte-level and byte-fallback vocabularies the bytes come from the vocabulary entry
    itself, and the text is their lenient decoding (as the llama.cpp engine reports both).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        # "Ġ" is the byte-level spelling of a space: every byte-level vocabulary is full of it.
        byte_level = any("Ġ" in entry for entry in tokenizer.get_vocab())
        self._alphabet = _byte_level_alphabet() if byte_level else {}
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int, decoded: str | None) -> tuple[str, bytes]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._piece(token_id, decoded)
        return hit

    def _piece(self, token_id: int, decoded: str | None) -> tuple[str, bytes]:
        entry = self._tokenizer.convert_ids_to_tokens(token_id)
        raw: bytes | None = None
        if isinstance(entry, str) and entry:
            if self._alphabet and all(c in self._alphabet for c in entry):
                raw = bytes(self._alphabet[c] for c in entry)
            elif not self._alphabet and (match := _BYTE_TOKEN.fullmatch(entry)):
                raw = bytes([int(match.group(1), 16)])
        if raw is None:
            text = decoded if decoded is not None else self._tokenizer.decode([token_id])
            return text, text.encode()
        return raw.decode("utf-8", errors="replace"), raw


def token_logprobs(pieces: TokenPieces, ids: list[int], entries: list[Any], top: int) -> list[TokenLogprob]:
    """vLLM's per-position `{token_id: Logprob}` maps (the chosen token plus the `top` likeliest,
    each with its rank) as `TokenLogprob`s; a `None` entry (the first prompt token) has no logprob."""
    out: list[TokenLogprob] = []
    for token, entry in zip(ids, entries, strict=True):
        if entry is None:
            out.append(TokenLogprob(*pieces(token, None), None))
            continue
        chosen = entry[token]
        text, raw = pieces(token, chosen.decoded_token)
        best = sorted((lp.rank, -lp.logprob, tid) for tid, lp in entry.items() if lp.rank <= top)
        alternatives = [
            TopLogprob(*pieces(tid, entry[tid].decoded_token), float(entry[tid].logprob))
            for _, _, tid in best
        ]
        out.append(TokenLogprob(text, raw, float(chosen.logprob), alternatives))
    return out


@dataclass(slots=True)
class VllmEngineStats(EngineStats):
    """The replica's counters plus vLLM's own view, so tests and operators can check that the
    engine batches requests and that an abort really left the engine.

    `core_*` come from the EngineCore scheduler's statistics, reported after each engine step
    (including the step that retires aborted requests).
    """

    engine_unfinished: int = 0  # requests AsyncLLM's front end still tracks
    core_running: int = 0  # sequences in the scheduler's running batch after the last step
    core_waiting: int = 0
    core_peak_running: int = 0  # the largest batch seen since the engine started
    decode_steps: int = 0  # engine steps that generated tokens
    decode_tokens: int = 0  # tokens generated by those steps
    engine_restarts: int = 0


class CoreCounters:
    """Filled by the stat logger on the replica's event loop (AsyncLLM's output handler)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.peak_running = 0
        self.decode_steps = 0
        self.decode_tokens = 0

    def scheduled(self, running: int, waiting: int) -> None:
        self.running, self.waiting = running, waiting
        self.peak_running = max(self.peak_running, running)

    def generated(self, tokens: int) -> None:
        self.decode_steps += 1
        self.decode_tokens += tokens


def stat_logger_factory(counters: CoreCounters) -> Any:
    """A vLLM `StatLoggerFactory` whose loggers write into `counters`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _CoreStatsLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._counters = counters

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                self._counters.scheduled(scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs)
            if iteration_stats is not None and iteration_stats.num_generation_tokens:
                self._counters.generated(iteration_stats.num_generation_tokens)

        def log_engine_initialized(self) -> None:
            return None

    return _CoreStatsLogger
