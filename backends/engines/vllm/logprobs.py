"""vLLM's logprobs in the gateway's terms: each token's real bytes and text (`TokenPieces`), and
vLLM's per-position logprob maps as `TokenLogprob`s. Its own module because the bytes come from
the tokenizer's vocabulary, a concern apart from sampling and from the engine's life.

Nothing here imports vLLM: it runs in the replica on the tokenizer and the objects vLLM hands over.
"""

from __future__ import annotations

import re
from typing import Any

from raygate.protocol.generation import TokenLogprob, TopLogprob


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
