"""What `make bench` measures: the workloads, the targets that serve them, and the scenarios.

Targets (the ladder, plus the peer and the ceiling):
    L0     the llama.cpp engine called in-process (no HTTP, no Ray)
    L1     Raygate's HTTP + SSE layer with engines in-process (bench/inproc_app.py, no Ray)
    L2     the full gateway: `raygate serve` (HTTP -> Ray replica -> engine)
    L2-batched  the same gateway, model `smollm2-batched`: 4 sequences per llama.cpp decode
    serve  a gateway of its own running exactly `make serve`'s models/default.yaml (chat and
           embedding models), so no other target's replicas share the cores: what a user of
           `make serve` gets (one chat replica, 8 sequences per decode, a thread per core for
           prompts and several sequences, all cores but one for a single sequence's decode, each
           token sent as soon as it is made)
    serve-fa-off  the same gateway, its chat model updated to `engine: {flash_attn: false}`
           (the attention kernels of llama-server-fa-off, and an F16 V cache)
    serve-all-threads  the same, a single sequence's decode on every core too (`n_threads:
           auto`, the default until 2026-11-29)
    serve-2x1  the same gateway, its chat model updated to an earlier default: 2 replicas x 1
           thread x 4 sequences per decode, every token its own Ray item
           (the shapes take turns in the rounds: an admin update before each run)
    peer   `python -m llama_cpp.server`, same GGUF, same threads per engine
    llama-server  llama.cpp's own C++ server (bench/llama_server.py builds it), same GGUF, as many
           threads as the Raygate target's replicas together, 8 slots
    llama-server-native  the same sources built for this CPU (GGML_NATIVE=ON), as llama.cpp's
           release binaries pick the best variant at run time: the peer as its users run it
    llama-server-fa-off  the same with `--flash-attn off`: serve-fa-off's attention kernels
    bare   a bare uvicorn streaming app, one socket write per frame (bench/bare_app.py)
    bare-joined  the same app writing all frames at once: the ceiling for "gateway alone"

Each scenario runs its targets side by side, in interleaved rounds (the order reversed every other
round), so slow drift of a shared machine lands on every target alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from raygate.protocol.generation import SamplingParams

OUTPUT_TOKENS = 128
LLAMA_SERVER_SLOTS = 8
# The llama-server targets: the build (bench/llama_server.py's variant) and the flags on top of the
# common command (bench/run.py): as it starts (flash attention `auto`, on for a CPU, as in
# Raygate's engines), built with the Makefile's portable flags and for this CPU; and without flash
# attention (as serve-fa-off). The goals hold against the faster of the first two.
LLAMA_SERVERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama-server": ("portable", ()),
    "llama-server-native": ("native", ()),
    "llama-server-fa-off": ("portable", ("--flash-attn", "off")),
}
# The peers the goals are held against: whichever of these is faster in a cell.
GOAL_PEERS = ("llama-server", "llama-server-native")
LLAMA_MODEL = "smollm2-135m-instruct"
BATCHED_MODEL = "smollm2-batched"
# The gateway's targets that serve another model of bench.yaml than LLAMA_MODEL.
MODEL_TARGETS = {"L2-batched": BATCHED_MODEL}
# Shapes of one gateway serving models/default.yaml: its chat model (LLAMA_MODEL) updated with these
# changes before each run of the target (bench/run.py `use_variant`).
SOLO_TARGETS: dict[str, dict[str, object]] = {
    "serve": {},  # models/default.yaml's chat model as it is
    # `engine:` changes are merged into the chat model's own (bench/run.py `variant_spec`).
    "serve-fa-off": {"engine": {"flash_attn": False}},
    "serve-all-threads": {"engine": {"n_threads": "auto"}},
    "serve-2x1": {
        "replicas": 2,
        "engine": {"n_ctx": 2048, "n_threads": 1, "n_seq_max": 4},
        "stream_interval_ms": 0,
    },
}
# A prompt the model keeps continuing: greedy decoding counts upward for far more than 128 tokens,
# so every target produces exactly OUTPUT_TOKENS (the client marks shorter outputs failed).
LLAMA_PROMPT = "Count upwards forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


def completion_body(model: str, prompt: str) -> dict[str, object]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # llama_cpp.server's defaults differ from OpenAI's; these make it sample as Raygate does.
        # Raygate takes `repeat_penalty` as its `repetition_penalty` (1.0: off, over a model's
        # `defaults:`, e.g. make serve's 1.1) and the other two as the values it uses anyway.
        "repeat_penalty": 1.0,
        "top_k": 0,
        "min_p": 0.0,
    }


# A long opening every request of the `llama-shared` workload repeats (a system prompt, the earlier
# turns of a conversation): what a prompt cache saves.
SHARED_OPENING = " ".join(
    f"Rule {i}: answer briefly, stay on topic, cite sources when you can, and never invent facts."
    for i in range(1, 16)
)
WORKLOADS: dict[str, dict[str, object]] = {
    "llama": completion_body(LLAMA_MODEL, LLAMA_PROMPT),
    "llama-shared": completion_body(LLAMA_MODEL, SHARED_OPENING + "\n\n" + LLAMA_PROMPT),
    "instant": completion_body("instant", "Hello"),
    "paced": completion_body("paced", "Hello"),
}
# Workloads with each request's own number in the prompt: at the start (no prompt cache can serve
# them), or after the shared opening (a new question after the same system prompt: only the
# opening can come from a cache).
UNIQUE = frozenset({"llama-unique", "llama-shared-new"})
WORKLOADS["llama-unique"] = WORKLOADS["llama"]
WORKLOADS["llama-shared-new"] = completion_body(LLAMA_MODEL, SHARED_OPENING + "\n\n{n}. " + LLAMA_PROMPT)
L0_SAMPLING = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0)
PACED_TTFT_MS = 20.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """One comparison: a workload, the targets that serve it, the concurrency levels, and how many interleaved
    rounds and requests measure each."""

    name: str
    workload: str
    targets: tuple[str, ...]
    levels: tuple[int, ...]
    rounds: int
    requests_per_stream: int  # per round: requests = max(min_requests, this x concurrency)
    min_requests: int
    max_seconds: float = 120.0  # per (round, target, level): bounded time as well as counts


# One long opening sent again and again, whole: what a prompt cache saves at its best.
_REPEAT = Scenario(
    "llama-server-repeat",
    "llama-shared",
    ("serve", "serve-2x1", "llama-server", "llama-server-native"),
    (1, 8),
    rounds=2,
    requests_per_stream=2,
    min_requests=4,
)
SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "llama-c1", "llama", ("L0", "L1", "L2", "peer"), (1,), rounds=4, requests_per_stream=3, min_requests=3
    ),
    Scenario(
        "llama-load",
        "llama",
        ("L2", "L2-batched", "peer"),
        (2, 4, 8),
        rounds=1,
        requests_per_stream=2,
        min_requests=4,
    ),
    Scenario(
        "instant",
        "instant",
        ("bare", "bare-joined", "L1", "L2"),
        (1,),
        rounds=3,
        requests_per_stream=100,
        min_requests=100,
    ),
    Scenario(
        "instant-load",
        "instant",
        ("bare", "bare-joined", "L1", "L2"),
        (8, 32),
        rounds=1,
        requests_per_stream=25,
        min_requests=200,
    ),
    Scenario("paced", "paced", ("L1", "L2"), (1, 8), rounds=2, requests_per_stream=3, min_requests=6),
    # llama.cpp's own server: every prompt new (nothing cached), then one long opening repeated.
    Scenario(
        "llama-server",
        "llama-unique",
        (
            "serve",
            "serve-fa-off",
            "serve-all-threads",
            "serve-2x1",
            "llama-server",
            "llama-server-native",
            "llama-server-fa-off",
        ),
        (1, 8),
        rounds=3,
        requests_per_stream=2,
        min_requests=4,
    ),
    _REPEAT,
    # The same opening, then a question of its own each time: the opening from the cache, the rest
    # evaluated (a shared system prompt; a conversation's next turn).
    replace(_REPEAT, name="llama-server-extend", workload="llama-shared-new"),
)
MEMORY_REQUESTS = 2000
MEMORY_CONCURRENCY = 8
MEMORY_SAMPLE_EVERY = 100


def quick(scenarios: tuple[Scenario, ...]) -> tuple[Scenario, ...]:
    """A smoke-sized plan: every step runs, numbers mean little."""
    return tuple(replace(s, rounds=1, requests_per_stream=1, min_requests=2) for s in scenarios)
