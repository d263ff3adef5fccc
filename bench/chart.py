"""The performance page's chart: output tokens/s and TTFT p50 against concurrency, for the llama.cpp model
(top; also against llama-server) and the instant engine (bottom); rows with no data are left
out. matplotlib is a bench-only dependency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROWS = (
    ("llama.cpp SmolLM2-135M, 128 tokens", ("llama-c1", "llama-load")),
    ("vs llama-server, new prompts, 128 tokens", ("llama-server",)),
    ("vs llama-server, repeated opening, 128 tokens", ("llama-server-repeat",)),
    ("vs llama-server, shared opening, new question, 128 tokens", ("llama-server-extend",)),
    ("instant engine (gateway alone), 128 tokens", ("instant", "instant-load")),
)
STYLE = {
    "L0": ("engine in-process (L0)", "tab:gray"),
    "L1": ("HTTP, no Ray (L1)", "tab:blue"),
    "L2": ("Raygate gateway (L2)", "tab:red"),
    "L2-batched": ("Raygate, 4 sequences per decode", "tab:orange"),
    "serve": ("make serve (own gateway)", "tab:red"),
    "serve-fa-off": ("make serve, flash attention off", "tab:brown"),
    "serve-all-threads": ("make serve, one sequence's decode on every core", "goldenrod"),
    "serve-2x1": ("make serve's earlier shape, 2 x 1 thread", "tab:cyan"),
    "peer": ("llama_cpp.server", "tab:green"),
    "llama-server": ("llama-server (llama.cpp C++)", "tab:olive"),
    "llama-server-native": ("llama-server built for this CPU", "tab:gray"),
    "llama-server-fa-off": ("llama-server, flash attention off", "tab:olive"),
    "bare": ("bare uvicorn app, write per frame", "tab:purple"),
    "bare-joined": ("bare uvicorn app, one write", "tab:pink"),
}


def _series(
    record: dict[str, Any], scenarios: tuple[str, ...]
) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for name in scenarios:
        for run in record.get("scenarios", {}).get(name, {}).get("runs", []):
            out.setdefault(run["target"], []).append((run["concurrency"], run["summary"]))
    return {t: sorted(points, key=lambda p: p[0]) for t, points in out.items()}


def render(record: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(t, s) for t, s in ROWS if _series(record, s)] or list(ROWS[:1])
    fig, axes = plt.subplots(
        len(rows), 2, figsize=(11, 4 * len(rows)), constrained_layout=True, squeeze=False
    )
    for (title, scenarios), (ax_tps, ax_ttft) in zip(rows, axes, strict=True):
        for target, points in _series(record, scenarios).items():
            label, color = STYLE.get(target, (target, None))
            xs = [c for c, _ in points]
            ax_tps.plot(xs, [s["output_throughput"] for _, s in points], "o-", label=label, color=color)
            ax_ttft.plot(xs, [s["ttft_ms"]["p50"] for _, s in points], "o-", label=label, color=color)
        ax_tps.set_title(f"{title}: output tokens/s")
        ax_ttft.set_title(f"{title}: TTFT p50 (ms)")
        ax_ttft.set_yscale("log")
        for ax in (ax_tps, ax_ttft):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.grid(True, which="both", alpha=0.3)
        ax_tps.set_ylim(bottom=0)
        ax_tps.legend(fontsize=8)
    loads = [r["loadavg"] for s in record.get("scenarios", {}).values() for r in s["runs"] if "loadavg" in r]
    load = f", load average {min(loads):.0f}–{max(loads):.0f}" if loads else ""
    cpus = record.get("machine_before", {}).get("cpus")
    fig.suptitle(f"Raygate bench {record.get('date', '')}: {cpus} cores shared with other work{load}")
    fig.savefig(path, dpi=100)
    plt.close(fig)
