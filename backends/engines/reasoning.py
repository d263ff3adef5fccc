"""A reasoning model's thinking split from its answer, as the tokens stream: one parser for every engine.

Reasoning models write `<think>...</think>` before the answer (Qwen3, DeepSeek-R1 and its
distills, SmolLM3, Granite...). `ReasoningSplitter` takes the decoded text piece by piece and
returns what is thinking and what is answer; a marker split across pieces (`</th` + `ink>`) is
held back until decided, as `StopMatcher` holds a stop string. Two parsers, named as vLLM's:

* `deepseek_r1`: the output is thinking until `</think>` (R1's template opens `<think>` in the
  prompt, so the output rarely has it); without an end marker everything is thinking.
* `qwen3`: thinking only inside `<think>...</think>` at the start of the output, or from the
  start when the prompt itself opened it (Qwen3-Thinking-2507, and `tiny-reasoner`'s template);
  an output that opens none (`enable_thinking: false`, whose template writes an empty
  `<think></think>` into the prompt) is all answer. Thinking cut off by `max_tokens` stays
  thinking, as vLLM streams it.

* `harmony` (vLLM: `openai_gptoss`): gpt-oss's channels. The thinking is the `analysis` channel
  (`<|channel|>analysis<|message|>...<|end|>`), the answer the `final` one
  (`<|start|>assistant<|channel|>final<|message|>...`); the headers and `<|end|>`/`<|return|>`
  never reach the client. The end of thinking is the whole sequence `HARMONY_END` (several
  tokens), which a budget forces. Thinking cannot be turned off: `enable_thinking: false` is
  ignored, as vLLM's gpt-oss parser does (effort `low` is the least there is).

Both begin in the answer when the prompt already closed thinking (the template's way of turning
it off). Whitespace right after the end marker is dropped (templates write `</think>\\n\\n`).

The engine also uses the splitter's state: while `thinking`, a request's budget counts down and
the output constraint (json_schema, tool-call grammar) waits; once the answer begins it applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

from raygate.protocol.capabilities import ReasoningConfig

START = "<think>"
END = "</think>"

# gpt-oss's harmony format: a message is `<|start|>ROLE<|channel|>CHANNEL<|message|>TEXT<|end|>`.
HARMONY_CHANNEL = "<|channel|>"
HARMONY_MESSAGE = "<|message|>"
HARMONY_ANALYSIS = HARMONY_CHANNEL + "analysis" + HARMONY_MESSAGE
HARMONY_FINAL = "<|start|>assistant" + HARMONY_CHANNEL + "final" + HARMONY_MESSAGE
HARMONY_END = "<|end|>" + HARMONY_FINAL  # what ends the thinking (a budget forces it whole)
_HARMONY_CLOSERS = ("<|end|>", "<|return|>", "<|call|>")  # never part of an answer's text
_HARMONY_HEAD = 256  # a header longer than this is not one: it is text

Parser = Literal["deepseek_r1", "qwen3", "harmony"]
State = Literal["before", "thinking", "answer"]
# vLLM's names for the same parsers.
ALIASES: dict[str, Parser] = {"openai_gptoss": "harmony"}


def detect(template: str | None) -> Parser | None:
    """The parser a chat template implies: gpt-oss's `<|channel|>` is harmony; `<think>` with an
    `enable_thinking` switch is Qwen3's convention, `<think>` alone DeepSeek-R1's; anything else
    does not think (as far as we know)."""
    if template and HARMONY_CHANNEL in template:
        return "harmony"
    if not template or START not in template:
        return None
    return "qwen3" if "enable_thinking" in template else "deepseek_r1"


def end_marker(parser: Parser) -> str:
    """The text that ends the thinking, which a spent budget (or an end of turn) writes."""
    return HARMONY_END if parser == "harmony" else END


def markers(name: str) -> tuple[str, str]:
    """(start, end) of the thinking for a parser named in a model spec (aliases and `auto` too:
    `auto` is taken for `<think>`, as the spec alone cannot tell): what vLLM's thinking budget counts
    from and forces (its `reasoning_config`, which takes multi-token markers)."""
    if ALIASES.get(name, name) == "harmony":
        return HARMONY_ANALYSIS, HARMONY_END
    return START, END


def can_disable(parser: Parser) -> bool:
    """Whether a request may turn thinking off: not on gpt-oss (vLLM ignores `enable_thinking`
    for it too; `reasoning_effort: low` is the least thinking there is)."""
    return parser != "harmony"


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """A model's resolved reasoning setup: its parser and default budget."""

    parser: Parser
    budget: int | None = None

    def budget_for(self, requested: int | None) -> int | None:
        return requested if requested is not None else self.budget


def resolve(config: ReasoningConfig | None, template: str | None) -> ReasoningFormat | None:
    """The format a loaded model uses, or None (no `reasoning:` block, `parser: none`, or `auto`
    on a template with no thinking markers)."""
    if config is None or config.parser == "none":
        return None
    named = ALIASES.get(config.parser, config.parser)
    parser = detect(template) if named == "auto" else cast(Parser, named)
    return None if parser is None else ReasoningFormat(parser, config.budget)


def prompt_state(prompt: str, parser: Parser = "qwen3") -> Literal["open", "closed", "none"]:
    """Whether the rendered prompt ends inside thinking (`<think>` last), just after it (`</think>`
    last, nothing but whitespace after), or neither. Harmony: inside the analysis channel's
    message, or inside the final channel's."""
    tail = prompt.rstrip()
    if parser == "harmony":
        if tail.endswith(HARMONY_ANALYSIS):
            return "open"
        return "closed" if tail.endswith(HARMONY_CHANNEL + "final" + HARMONY_MESSAGE) else "none"
    if tail.endswith(START):
        return "open"
    if tail.endswith(END):
        return "closed"
    return "none"


def _held(buf: str, marker: str) -> int:
    """How many characters at the end of `buf` could still begin `marker`."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


class ReasoningSplitter:
    """Splits one sequence's streamed text into (thinking, answer). Not thread-safe."""

    def __init__(self, parser: Parser, prompt: Literal["open", "closed", "none"] = "none") -> None:
        self.parser = parser
        if prompt == "closed":
            self.state: State = "answer"
        elif prompt == "open" or parser == "deepseek_r1":
            self.state = "thinking"
        else:
            self.state = "before"
        self._buf = ""
        self._fresh = True  # at the start of the thinking: a `<think>` the model repeats is dropped
        self._lead = False  # just after the end marker: whitespace is dropped
        self._header = False  # harmony: after `<|end|>`, reading the next message's header
        self.ended = False  # the end marker was seen

    @property
    def thinking(self) -> bool:
        """Whether the next token still belongs to the thinking (or may: `before`)."""
        return self.state != "answer"

    def push(self, text: str) -> tuple[str, str]:
        """Returns (thinking, answer) safe to emit for this piece."""
        self._buf += text
        thought: list[str] = []
        answer: list[str] = []
        while self._step(thought, answer):
            pass
        return "".join(thought), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """End of the sequence: what was held back was not a marker after all."""
        buf, self._buf = self._buf, ""
        if self.parser == "harmony":
            if self.state == "answer":
                return "", _drop_closers(buf.lstrip() if self._lead else buf)
            if self.state == "before" or self._header:
                return "", ""  # a header cut short: markers, not text
        if self.state == "thinking":
            return buf, ""
        if self.state == "answer" and self._lead:
            buf = buf.lstrip()
        return "", buf

    def _step(self, thought: list[str], answer: list[str]) -> bool:
        if self.parser == "harmony":
            return self._harmony(thought, answer)
        if self.state == "before":
            body = self._buf.lstrip()
            if body.startswith(START):
                self._buf = body[len(START) :]
                self.state = "thinking"
                return True
            if not body or START.startswith(body):
                return False  # may still become `<think>`
            self.state = "answer"
            return True
        if self.state == "thinking":
            if self._fresh:
                body = self._buf.lstrip()
                if body.startswith(START):
                    self._buf = body[len(START) :]
                elif not body or START.startswith(body):
                    return False
                self._fresh = False
            if self._until(END, thought):
                self.state, self._lead, self.ended = "answer", True, True
                return True
            return False
        if not self._past_lead():
            return False
        answer.append(self._buf)
        self._buf = ""
        return False

    def _past_lead(self) -> bool:
        """Drops the whitespace right after the end of thinking; False while nothing else came."""
        if self._lead:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._lead = False
        return True

    def _until(self, marker: str, out: list[str]) -> bool:
        """Moves the text before `marker` to `out` and drops the marker (True), or, with no marker
        yet, all the text that cannot be its beginning (False)."""
        at = self._buf.find(marker)
        if at >= 0:
            out.append(self._buf[:at])
            self._buf = self._buf[at + len(marker) :]
            return True
        hold = _held(self._buf, marker)
        out.append(self._buf[: len(self._buf) - hold])
        self._buf = self._buf[len(self._buf) - hold :]
        return False

    def _harmony(self, thought: list[str], answer: list[str]) -> bool:
        """One step of gpt-oss's channels: a header up to `<|message|>` says whether the message
        is thinking (`analysis`) or answer (`final`, or anything else); a message ends at `<|end|>`."""
        if self.state == "before" or self._header:
            head = _header(self._buf)
            if head is None:
                return False  # may still be a header
            channel, rest = ("", self._buf) if head is False else head  # False: text, no header
            self._header, self._buf = False, rest
            if "analysis" in channel and "final" not in channel:
                self.state = "thinking"
            else:
                self.ended = self.ended or self.state == "thinking"
                self.state, self._lead = "answer", True
            return True
        if self.state == "thinking":
            if self._until("<|end|>", thought):
                self._header = True
                return True
            return False
        if not self._past_lead():
            return False
        text = _drop_closers(self._buf)
        hold = max(_held(text, m) for m in _HARMONY_CLOSERS)
        answer.append(text[: len(text) - hold])
        self._buf = text[len(text) - hold :]
        return False


def _header(buf: str) -> tuple[str, str] | Literal[False] | None:
    """A harmony message header at the start of `buf` (`<|start|>assistant<|channel|>final`, or
    `<|channel|>analysis` when the prompt opened the message): (the header, what follows its
    `<|message|>`); None while it may still become one; False when it is not one."""
    body = buf.lstrip()
    if not body:
        return None
    if not body.startswith("<|"):
        return False if not "<|".startswith(body) else None
    at = body.find(HARMONY_MESSAGE)
    if at >= 0:
        return body[:at], body[at + len(HARMONY_MESSAGE) :]
    return None if len(body) < _HARMONY_HEAD else False


def _drop_closers(text: str) -> str:
    for marker in _HARMONY_CLOSERS:
        text = text.replace(marker, "")
    return text


# Written after a prompt whose template cannot turn thinking off itself (no `enable_thinking`):
# an empty thought, as Qwen3's template writes it when thinking is off.
_CLOSED = "\n\n" + END + "\n\n"


def closing_text(prompt: str, parser: Parser = "qwen3") -> str:
    """What to append to a rendered prompt so that thinking is off: nothing when the template
    closed it already, the end marker when it opened it, an empty thought otherwise."""
    state = prompt_state(prompt, parser)
    if state == "closed":
        return ""
    if parser == "harmony":
        return HARMONY_END if state == "open" else HARMONY_ANALYSIS + HARMONY_END
    return _CLOSED if state == "open" else START + _CLOSED


@dataclass(slots=True)
class ThinkingPlan:
    """One chat request's thinking, decided before decoding: the parser, whether the prompt left
    thinking open or closed, the budget, the tokens that spell the end marker (forced when the
    budget is spent), and whether the thinking is shown."""

    parser: Parser
    prompt: Literal["open", "closed", "none"]
    budget: int | None
    end_tokens: list[int]
    include: bool = True

    @property
    def end_text(self) -> str:
        return end_marker(self.parser)

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.parser, self.prompt)
