"""Forward passes (`llama_decode` calls) during a run, read off the servers' own Prometheus
metrics: Raygate's `raygate:forward_*` counters for the chat model, llama-server's
`llamacpp:n_decode_total` (it is started with `--metrics`).

Why: tokens/s says how fast a server was, not where its time went. Wall time per pass is
comparable across both servers (a pass is one decode step of every running sequence, plus any
prompt chunks); Raygate's time inside llama.cpp per pass splits that step into compute and
serving under the real load, which an in-process profile (`bench.decode_profile`) cannot show."""

from __future__ import annotations

import httpx

from bench.prometheus import metric

RAYGATE = {
    "passes": "raygate:forward_passes_total",
    "tokens": "raygate:forward_tokens_total",
    "seconds": "raygate:forward_seconds_total",
}
LLAMA_SERVER_PASSES = "llamacpp:n_decode_total"


def parse(text: str, model: str) -> dict[str, float]:
    """The counters in a `/metrics` text: Raygate's for `model`, or llama-server's."""
    found = {key: metric(text, name, model_name=model) for key, name in RAYGATE.items()}
    if found["passes"] is None:
        found["passes"] = metric(text, LLAMA_SERVER_PASSES)
    return {key: value for key, value in found.items() if value is not None}


async def read(url: str, model: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=30) as http:
        return parse((await http.get(f"{url}/metrics")).text, model)


def add(totals: dict[str, float], before: dict[str, float], after: dict[str, float]) -> None:
    """Add what grew between two readings of the same replicas to `totals`."""
    for key, value in after.items():
        totals[key] = totals.get(key, 0.0) + value - before.get(key, 0.0)


def summary(totals: dict[str, float], wall_s: float) -> dict[str, float]:
    """Per pass: wall milliseconds, and where known, milliseconds inside llama.cpp and tokens."""
    passes = totals.get("passes", 0.0)
    if passes <= 0:
        return {}
    out = {"passes": passes, "wall_ms_per_pass": 1000 * wall_s / passes}
    if "seconds" in totals:
        out["compute_ms_per_pass"] = 1000 * totals["seconds"] / passes
        out["tokens_per_pass"] = totals.get("tokens", 0.0) / passes
    return out
