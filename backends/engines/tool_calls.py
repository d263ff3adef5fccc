"""Tool calling as text: how tools are shown to a model, and how its calls are read back.

Engine-neutral, so every backend speaks one format. The model is told about the tools in a
system block and answers a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(the Hermes / Qwen convention, which many open models were trained on). Engines constrain that
text with a grammar built from `call_schema()`: from the first token when a call is required, and
from the opening tag on when the model may choose (`auto`), so a call always parses. Earlier calls
and tool results are written back into the conversation the same way, which keeps follow-up turns
working with chat templates that know nothing about tools.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from typing import Any

from raygate.protocol.errors import UnsupportedParameterError
from raygate.protocol.generation import ChatMessage, FunctionTool, SamplingParams, ToolCallDelta, ToolsSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# A lazy grammar wakes up when the generated text matches this (llama.cpp matches the whole
# text so far; the grammar then constrains the text from the capture group on).
TRIGGER_PATTERN = r"[\s\S]*?(<tool_call>)[\s\S]*"
# What may follow the tag in the text that wakes the grammar: it starts `<tool_call>\n{`.
_WAKE_PREFIXES = (b"", b"\n", b"\n{")


def trigger_is_safe(text: bytes) -> bool | None:
    """For a lazy tool-call grammar: None while `text` (the output so far) holds no `<tool_call>`,
    else whether the grammar accepts what follows the first one (llama.cpp gives it the text from
    the tag on). Conservative: only the ways a call block can start."""
    at = text.find(OPEN.encode())
    if at < 0:
        return None
    return text[at + len(OPEN) :] in _WAKE_PREFIXES


def active(tools: ToolsSpec | None) -> bool:
    """Whether this request may produce tool calls at all."""
    return tools is not None and tools.choice != "none" and bool(tools.offered())


def forced(tools: ToolsSpec | None) -> bool:
    return active(tools) and tools is not None and tools.choice in ("required", "function")


def constraint_param(sampling: SamplingParams) -> str:
    """The request field an output constraint came from, for errors about it."""
    return "response_format" if sampling.json_schema is not None else "structured_outputs"


def refuse_schema_with_tools(sampling: SamplingParams, tools: ToolsSpec | None, backend: str) -> None:
    """One constraint per request: a call block and a response schema (or regex, choice list,
    grammar) cannot both hold."""
    if sampling.constrained and active(tools):
        param = constraint_param(sampling)
        raise UnsupportedParameterError(
            f"`{param}` together with `tools` is not supported by the {backend} backend "
            "(set `tool_choice: none`, or drop one of them).",
            param=param,
        )


def system_block(tools: ToolsSpec) -> str:
    offered = tools.offered()
    listing = "\n".join(
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.parameters or {"type": "object", "properties": {}},
                },
            }
        )
        for t in offered
    )
    how_many = "one or more functions" if tools.parallel else "at most one function"
    if tools.choice == "required":
        how_many = "one or more functions" if tools.parallel else "exactly one function"
    return (
        "# Tools\n\n"
        f"You may call {how_many} to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{OPEN}{CLOSE} XML tags:\n"
        f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}'
    )


def _call_text(name: str, arguments: str) -> str:
    try:
        args: Any = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = arguments
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': args})}\n{CLOSE}"


def render_messages(messages: list[ChatMessage], tools: ToolsSpec | None) -> list[dict[str, str]]:
    """Turns into plain role/content dicts any chat template can render.

    `developer` is OpenAI's new name for `system`; tool results become a user turn (consecutive
    results share one), so templates that insist on user/assistant alternation still work.
    """
    out: list[dict[str, str]] = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        content = m.content
        if m.role == "assistant" and m.tool_calls:
            calls = "\n".join(_call_text(c.name, c.arguments) for c in m.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        if m.role in ("tool", "function"):
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool") == "1":
                out[-1]["content"] += "\n" + block
                continue
            out.append({"role": "user", "content": block, "_tool": "1"})
            continue
        turn = {"role": role, "content": content}
        if m.name:
            turn["name"] = m.name
        out.append(turn)
    for turn in out:
        turn.pop("_tool", None)
    if active(tools):
        assert tools is not None
        block = system_block(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _hoist_defs(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Moves a parameters schema's `$defs` to the root of the combined call schema, renaming
    them so two tools' definitions cannot collide, and rewrites the `$ref`s that point at them."""
    schema = copy.deepcopy(schema)
    local = {**schema.pop("$defs", {}), **schema.pop("definitions", {})}

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                for base in ("#/$defs/", "#/definitions/"):
                    if ref.startswith(base):
                        node = {**node, "$ref": f"#/$defs/{prefix}{ref[len(base) :]}"}
            return {k: rewrite(v) for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    for name, sub in local.items():
        defs[f"{prefix}{name}"] = rewrite(sub)
    return dict(rewrite(schema))


def call_schema(tools: list[FunctionTool]) -> dict[str, Any]:
    """JSON schema of one call object `{"name": ..., "arguments": {...}}` to any of `tools`."""
    defs: dict[str, Any] = {}
    variants = []
    for i, tool in enumerate(tools):
        params = tool.parameters or {"type": "object"}
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    "arguments": _hoist_defs(params, f"tool{i}_", defs),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Splits streamed text into content and tool calls, incrementally.

    Text outside `<tool_call>` blocks is content (a possible start of the tag is held back until
    decided). Inside a block, once `{"name": "...", "arguments":` has arrived the call is
    announced and its arguments stream as they are generated: a string-aware brace count finds
    where they end. A block in another shape is parsed whole when it closes; one that is not a
    call at all goes back into the content unchanged.
    """

    def __init__(self) -> None:
        self._state = "text"
        self._buf = ""
        self._calls = 0
        self._scan = 0  # how far into _buf the argument scanner has read
        self._depth = 1
        self._in_string = False
        self._escaped = False
        self._args_started = False

    @property
    def called(self) -> bool:
        return self._calls > 0

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._step(content, calls):
            pass
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """End of generation: flush what was held back (a truncated call stays truncated)."""
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        buf, self._buf = self._buf, ""
        if self._state == "text":
            if not (self.called and not buf.strip()):
                content.append(buf)
        elif self._state == "header":
            self._whole_block(buf, content, calls)
        elif self._state == "args":
            if buf:
                calls.append(ToolCallDelta(self._calls, arguments=buf))
            self._calls += 1
        self._state = "text"
        return "".join(content), calls

    def _step(self, content: list[str], calls: list[ToolCallDelta]) -> bool:
        """Advance one state if the buffer allows; return whether anything changed."""
        if self._state == "text":
            at = self._buf.find(OPEN)
            if at >= 0:
                before = self._buf[:at]
                if before and not (self.called and not before.strip()):
                    content.append(before)
                self._buf = self._buf[at + len(OPEN) :]
                self._state = "header"
                return True
            hold = next(
                (k for k in range(min(len(OPEN) - 1, len(self._buf)), 0, -1) if self._buf.endswith(OPEN[:k])),
                0,
            )
            ready = self._buf[: len(self._buf) - hold]
            if self.called and not ready.strip():
                return False  # whitespace between calls: keep it until something follows
            content.append(ready)
            self._buf = self._buf[len(ready) :]
            return False
        if self._state == "header":
            match = _HEADER.match(self._buf)
            if match:
                name = json.loads(f'"{match.group(1)}"')
                calls.append(ToolCallDelta(self._calls, "", new_call_id(), name))
                self._buf = self._buf[match.end() :]
                self._state, self._scan, self._depth = "args", 0, 1
                self._in_string = self._escaped = self._args_started = False
                return True
            end = self._buf.find(CLOSE)
            if end >= 0:
                block, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
                self._whole_block(block, content, calls)
                self._state = "text"
                return True
            return False
        if self._state == "args":
            return self._scan_arguments(calls)
        # "after": the outer object closed; skip to the end of the block.
        end = self._buf.find(CLOSE)
        if end < 0:
            return False
        self._buf = self._buf[end + len(CLOSE) :]
        self._state = "text"
        return True

    def _scan_arguments(self, calls: list[ToolCallDelta]) -> bool:
        if not self._args_started:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._args_started = True
        buf, i = self._buf, self._scan
        while i < len(buf):
            c = buf[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:  # the call object itself closed: arguments end here
                    piece = buf[:i].rstrip()
                    if piece:
                        calls.append(ToolCallDelta(self._calls, arguments=piece))
                    self._calls += 1
                    self._buf = buf[i + 1 :]
                    self._state = "after"
                    return True
            i += 1
        # Emit what was scanned, but hold trailing whitespace at the top level: it may turn out
        # to sit between the arguments and the closing brace.
        ready = buf[:i] if self._depth > 1 or self._in_string else buf[:i].rstrip()
        if ready:
            calls.append(ToolCallDelta(self._calls, arguments=ready))
        self._buf = buf[len(ready) :]
        self._scan = i - len(ready)
        return False

    def _whole_block(self, block: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        try:
            obj = json.loads(block)
            name, args = obj["name"], obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str):
                raise TypeError(name)
        except (ValueError, KeyError, TypeError, AttributeError):
            content.append(f"{OPEN}{block}{CLOSE}")
            return
        arguments = args if isinstance(args, str) else json.dumps(args)
        calls.append(ToolCallDelta(self._calls, arguments, new_call_id(), name))
        self._calls += 1
