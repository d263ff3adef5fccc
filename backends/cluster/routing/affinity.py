"""Prefix affinity: remember which replica last served each prompt prefix, so the next request that
starts the same way (same system prompt, the earlier turns of the same conversation) can go where
the engine's prompt cache (llama.cpp) or prefix cache (vLLM) already holds it.

Token-free and cheap: the prompt's text (a chat's messages, role-tagged, in order) is cut into
blocks of `block_chars` characters and hashed as a chain, so block i's key stands for the whole
text up to the end of block i. A request's longest known chain key names its preferred replica.
The map is an LRU bounded by `MAX_KEYS`; a few hundred bytes per prompt at most.

An image stands in the text as its digest (sha256 of its bytes, the key the engines' prompt caches
use too), repeated to the weight of a long text: an image is hundreds of prompt tokens in an
engine's cache, and the prefix that ends with it must make a whole block of its own, so the next
request with the same image goes to the replica that holds it even when little text follows.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from raygate.protocol.generation import ChatMessage, GenerateRequest

MAX_KEYS = 65_536
# Replicas remembered per prefix (the latest ones): a model rarely has more.
MAX_OWNERS = 16
# Separators that cannot occur in role names, so ("ab","c") and ("a","bc") never render alike.
_ROLE_END, _TURN_END = "\x1e", "\x1f"
# An image: `_IMAGE` + digest, this many times (~1 KB: a whole block at up to 1,040 `block_chars`).
_IMAGE, IMAGE_REPEATS = "\x1d", 16


def _content(message: ChatMessage) -> str:
    """A turn's text with each image where the client put it, as its repeated digest."""
    if not message.parts:
        return message.content
    return "".join(
        part if isinstance(part, str) else (_IMAGE + part.digest) * IMAGE_REPEATS for part in message.parts
    )


def prompt_text(request: GenerateRequest) -> str:
    """The prompt as one string, in the order the engine reads it (a chat template keeps the order),
    after the LoRA adapter set it decodes under: a replica's cache holds a prefix under one set
    only (docs/lora.md), so the same prompt under another adapter is another prefix."""
    lora = "".join(f"{name}{_ROLE_END}{scale}{_TURN_END}" for name, scale in request.lora)
    if request.messages is not None:
        return lora + "".join(f"{m.role}{_ROLE_END}{_content(m)}{_TURN_END}" for m in request.messages)
    if isinstance(request.prompt, list):
        return lora + " ".join(map(str, request.prompt))
    return lora + (request.prompt or "")


def prefix_keys(text: str, block_chars: int, max_blocks: int) -> list[bytes]:
    """Chained hashes of the text's whole blocks. A trailing partial block is not a reusable prefix
    yet, and a text shorter than one block has none: re-reading it costs a replica little, and
    pinning such prompts to one replica (the same short request sent many times at once) would
    only pile them up there."""
    blocks = min(len(text) // block_chars, max_blocks)
    keys: list[bytes] = []
    digest = b""
    for i in range(blocks):
        chunk = text[i * block_chars : (i + 1) * block_chars]
        digest = hashlib.blake2b(digest + chunk.encode("utf-8", "surrogatepass"), digest_size=12).digest()
        keys.append(digest)
    return keys


class PrefixTable:
    """Prefix key -> the replicas that served it, the latest last (LRU over keys).

    A prefix every live replica has served (a system prompt all conversations share) names no
    replica: each holds it, so sending its requests to one would only pile them up there (measured:
    1.13x least-loaded's TTFT on 16 conversations sharing one system prompt). What is left to
    prefer is a longer, rarer prefix: a conversation's own turns."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._owners: OrderedDict[bytes, list[str]] = OrderedDict()
        self._max = max_keys

    def __len__(self) -> int:
        return len(self._owners)

    def preferred(self, keys: list[bytes], alive: set[str]) -> str | None:
        """The live replica that served the longest of `keys` last, unless every one of several
        live replicas has served that prefix (None then, as for a prefix nobody served)."""
        for key in reversed(keys):
            owners = [r for r in self._owners.get(key, ()) if r in alive]
            if owners:
                return None if len(alive) > 1 and alive.issubset(owners) else owners[-1]
        return None

    def record(self, keys: list[bytes], replica_id: str) -> None:
        for key in keys:
            owners = self._owners.setdefault(key, [])
            if replica_id in owners:
                owners.remove(replica_id)
            owners.append(replica_id)
            del owners[:-MAX_OWNERS]
            self._owners.move_to_end(key)
        while len(self._owners) > self._max:
            self._owners.popitem(last=False)


class AdapterHolders:
    """Which LoRA adapters each replica last decoded under, as this gateway sent them: a bounded
    replica (`lora.max_loras`) holds only its latest `capacity` adapters and reads any other from
    its file first (docs/lora.md), so a request for an adapter goes where this gateway last sent
    it when that replica is not too loaded. This gateway's own view: another gateway's requests
    may have evicted it since, which costs a file read, never a wrong answer."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._held: dict[str, OrderedDict[str, None]] = {}

    def holding(self, names: tuple[str, ...], replica_ids: list[str]) -> list[str]:
        """The replicas among `replica_ids` believed to hold every adapter of `names`."""
        return [r for r in replica_ids if all(n in self._held.get(r, ()) for n in names)]

    def record(self, names: tuple[str, ...], replica_id: str) -> None:
        held = self._held.setdefault(replica_id, OrderedDict())
        for name in names:
            held.pop(name, None)
            held[name] = None
        while len(held) > self._capacity:
            held.popitem(last=False)

    def forget(self, alive: set[str]) -> None:
        for replica_id in [r for r in self._held if r not in alive]:
            del self._held[replica_id]
