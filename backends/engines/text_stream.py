"""Turning a token stream into text a client can be shown: UTF-8 reassembly and stop strings.

Both are engine-independent and pure, so they are unit-tested without a model.
"""

from __future__ import annotations

import codecs


class Utf8Stream:
    """Decodes byte pieces whose boundaries may split a multi-byte character (emoji, CJK)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings across piece boundaries and never lets one leak into the output, unless
    `include` (vLLM's `include_stop_str_in_output`): then the text ends with the stop string.

    Text that could still be the start of a stop string is held back until it is decided.
    """

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self._stops = [s for s in stops if s]
        self._include = include
        self._held = ""
        self.matched: str | None = None  # the stop string that was hit, once one is

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit)."""
        if not self._stops:
            return text, False
        buf = self._held + text
        hits = [(i, len(s)) for i, s in ((buf.find(s), s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            start, length = min(hits)
            self.matched = buf[start : start + length]
            return buf[: start + length if self._include else start], True
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """At the end of generation, held text was not a stop string after all."""
        held, self._held = self._held, ""
        return held
