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

Both begin in the answer when the prompt already closed thinking (the template's way of turning
it off). Whitespace right after the end marker is dropped (templates write `</think>\\n\\n`).

The engine also uses the splitter's state: while `thinking`, a request's budget counts down and
the output constraint (json_schema, tool-call grammar) waits; once the answer begins it applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raygate.protocol.config import ReasoningConfig

START = "<think>"
END = "</think>"

Parser = Literal["deepseek_r1", "qwen3"]
State = Literal["before", "thinking", "answer"]


def detect(template: str | None) -> Parser | None:
    """The parser a chat template implies: `<think>` with an `enable_thinking` switch is Qwen3's
    convention, `<think>` alone DeepSeek-R1's; anything else does not think (as far as we know)."""
    if not template or START not in template:
        return None
    return "qwen3" if "enable_thinking" in template else "deepseek_r1"


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
    parser = detect(template) if config.parser == "auto" else config.parser
    return None if parser is None else ReasoningFormat(parser, config.budget)


def prompt_state(prompt: str) -> Literal["open", "closed", "none"]:
    """Whether the rendered prompt ends inside thinking (`<think>` last), just after it (`</think>`
    last, nothing but whitespace after), or neither."""
    tail = prompt.rstrip()
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
        if self.state == "thinking":
            return buf, ""
        if self.state == "answer" and self._lead:
            buf = buf.lstrip()
        return "", buf

    def _step(self, thought: list[str], answer: list[str]) -> bool:
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
            at = self._buf.find(END)
            if at >= 0:
                thought.append(self._buf[:at])
                self._buf = self._buf[at + len(END) :]
                self.state, self._lead, self.ended = "answer", True, True
                return True
            hold = _held(self._buf, END)
            thought.append(self._buf[: len(self._buf) - hold])
            self._buf = self._buf[len(self._buf) - hold :]
            return False
        if self._lead:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._lead = False
        answer.append(self._buf)
        self._buf = ""
        return False


# Written after a prompt whose template cannot turn thinking off itself (no `enable_thinking`):
# an empty thought, as Qwen3's template writes it when thinking is off.
_CLOSED = "\n\n" + END + "\n\n"


def closing_text(prompt: str) -> str:
    """What to append to a rendered prompt so that thinking is off: nothing when the template
    closed it already, the end marker when it opened it, an empty thought otherwise."""
    state = prompt_state(prompt)
    if state == "closed":
        return ""
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

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.parser, self.prompt)
