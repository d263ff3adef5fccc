"""From a run record to the issue's targets: measured value, ratio, met or not, as JSON rows and as
the Markdown table docs/performance.md shows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench import plan


@dataclass(slots=True)
class TargetRow:
    """One of the issue's targets in the report: the goal, what was measured, and whether it was met (`None`
    when its step did not run)."""

    target: str
    goal: str
    measured: str
    met: bool | None  # None: nothing to compare against (the step did not run)


def _summary(record: dict[str, Any], scenario: str, target: str, level: int) -> dict[str, Any] | None:
    for run in record.get("scenarios", {}).get(scenario, {}).get("runs", []):
        if run["target"] == target and run["concurrency"] == level:
            summary: dict[str, Any] = run["summary"]
            return summary
    return None


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def slope_per_1000(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of MB against requests, scaled to MB per 1,000 requests."""
    n = len(points)
    if n < 2:
        return math.nan
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx * 1000 if sxx else math.nan


def memory_slopes(memory: dict[str, Any]) -> dict[str, float]:
    """Slopes after the first fifth of the run (allocator and caches warm up first)."""
    samples = memory["samples"]
    warm = [s for s in samples if s["requests"] >= memory["requests"] // 5]
    out = {"gateway": slope_per_1000([(s["requests"], s["gateway_mb"]) for s in warm])}
    pids = {r["pid"]: r["model"] for s in warm for r in s["replicas"]}
    for pid, model in pids.items():
        pts = [(s["requests"], r["rss_mb"]) for s in warm for r in s["replicas"] if r["pid"] == pid]
        out[f"replica {pid} ({model})"] = slope_per_1000(pts)
    return out


def evaluate(record: dict[str, Any]) -> list[TargetRow]:
    rows: list[TargetRow] = []

    def get(scenario: str, target: str, level: int) -> dict[str, Any] | None:
        return _summary(record, scenario, target, level)

    l0, l2 = get("llama-c1", "L0", 1), get("llama-c1", "L2", 1)
    if l0 and l2:
        r = _ratio(l2["output_throughput"], l0["output_throughput"])
        rows.append(
            TargetRow(
                "Gateway vs engine in-process, c=1: tokens/s",
                "≥ 0.97×",
                f"{l2['output_throughput']:.1f} vs {l0['output_throughput']:.1f} tok/s = {r:.3f}×",
                r >= 0.97,
            )
        )
        d = l2["ttft_ms"]["p50"] - l0["ttft_ms"]["p50"]
        rows.append(
            TargetRow(
                "Gateway vs engine in-process, c=1: TTFT overhead p50",
                "≤ 5 ms",
                f"{l2['ttft_ms']['p50']:.1f} − {l0['ttft_ms']['p50']:.1f} = {d:+.1f} ms",
                d <= 5,
            )
        )
    bare, g1, l1i = get("instant", "bare", 1), get("instant", "L2", 1), get("instant", "L1", 1)
    if g1:
        rows.append(
            TargetRow(
                "Gateway alone (instant engine), c=1: SSE tokens/s",
                "≥ 8,000",
                f"{g1['output_throughput']:,.0f} tok/s",
                g1["output_throughput"] >= 8000,
            )
        )
    joined = get("instant", "bare-joined", 1)
    for base, label in ((bare, "one write per frame"), (joined, "all frames in one write")):
        if g1 and base:
            r = _ratio(g1["output_throughput"], base["output_throughput"])
            rows.append(
                TargetRow(
                    f"Gateway alone vs bare uvicorn streaming app ({label}), c=1",
                    "≥ 0.5×",
                    f"{g1['output_throughput']:,.0f} vs {base['output_throughput']:,.0f} tok/s = {r:.2f}×",
                    r >= 0.5,
                )
            )
    if l1i and g1:
        r = _ratio(g1["output_throughput"], l1i["output_throughput"])
        rows.append(
            TargetRow(
                "Gateway alone vs same HTTP layer without Ray (L2/L1), c=1",
                "(ladder)",
                f"{r:.2f}×",
                None,
            )
        )
    paced = get("paced", "L2", 1)
    if paced:
        extra = paced["ttft_ms"]["p50"] - plan.PACED_TTFT_MS
        rows.append(
            TargetRow(
                f"No first-token batching delay (engine TTFT {plan.PACED_TTFT_MS:.0f} ms), c=1",
                "TTFT p50 − 20 ms ≤ 5 ms",
                f"{paced['ttft_ms']['p50']:.1f} ms (+{extra:.1f} ms)",
                extra <= 5,
            )
        )
    peer1, g1l = get("llama-c1", "peer", 1), l2
    if peer1 and g1l:
        r = _ratio(g1l["output_throughput"], peer1["output_throughput"])
        rows.append(
            TargetRow(
                "vs llama_cpp.server, c=1: tokens/s",
                "≥ 1.0×",
                f"{g1l['output_throughput']:.1f} vs {peer1['output_throughput']:.1f} tok/s = {r:.2f}×",
                r >= 1.0,
            )
        )
    peer8 = get("llama-load", "peer", 8)
    for target, label in (("L2", "2 replicas"), ("L2-batched", "2 replicas × 4 sequences per decode")):
        g8 = get("llama-load", target, 8)
        if not (peer8 and g8):
            continue
        r = _ratio(g8["output_throughput"], peer8["output_throughput"])
        rows.append(
            TargetRow(
                f"vs llama_cpp.server, c=8, {label}: aggregate tokens/s",
                "≥ 2×",
                f"{g8['output_throughput']:.1f} vs {peer8['output_throughput']:.1f} tok/s = {r:.2f}×",
                r >= 2.0,
            )
        )
        a, b = g8["ttft_ms"]["p90"], peer8["ttft_ms"]["p90"]
        rows.append(
            TargetRow(
                f"vs llama_cpp.server, c=8, {label}: TTFT p90",
                "lower than the peer's",
                f"{a:,.0f} vs {b:,.0f} ms",
                a < b,
            )
        )
    rows += _vs_llama_server(get)
    rows += _memory_vs_llama_server(record)
    memory = record.get("memory")
    if memory:
        slopes = memory_slopes(memory)
        first, last = memory["samples"][0], memory["samples"][-1]
        g = slopes["gateway"]
        rows.append(
            TargetRow(
                f"Memory over {memory['requests']:,} requests (gateway process)",
                "no growth",
                f"RSS {first['gateway_mb']:.0f} → {last['gateway_mb']:.0f} MB; slope {g:+.2f} MB/1k req",
                abs(g) < 1.0,
            )
        )
        reps = ", ".join(f"{r['model']} {r['rss_mb']:.0f} MB" for r in record.get("replica_rss_mb", []))
        worst = max((abs(v) for k, v in slopes.items() if k != "gateway"), default=math.nan)
        rows.append(
            TargetRow(
                "Memory per replica",
                "reported; no growth",
                f"{reps}; worst slope {worst:.2f} MB/1k req",
                worst < 1.0,
            )
        )
    return rows


LLAMA_SERVER_LABELS = {
    "serve": (
        "`make serve` (1 replica × 8 sequences, one sequence's decode on all cores but one, "
        "each token streamed at once)"
    ),
    "serve-fa-off": "`make serve` with `flash_attn: false`",
    "serve-all-threads": "`make serve` with one sequence's decode on every core (`n_threads: auto`)",
    "serve-2x1": "`make serve` with an earlier default, 2 replicas × 1 thread × 4 sequences",
}


def _vs_llama_server(get: Any) -> list[TargetRow]:
    """Issue 13's goals against llama.cpp's own server: tokens/s at least 1.0x and TTFT p50 at most 1.1x, on
    new prompts and on a repeated long opening (prompt caches). Issue 52: against the faster (in
    tokens/s) of its portable and native builds (`plan.GOAL_PEERS`), and its flash-attention-off run."""
    rows: list[TargetRow] = []
    for scenario, what in (
        ("llama-server", "new prompts"),
        ("llama-server-repeat", "repeated opening"),
        ("llama-server-extend", "shared opening, new question"),
    ):
        for level in (1, 8):
            built = [name for name in plan.GOAL_PEERS if get(scenario, name, level)]
            peers = [max(built, key=lambda n: get(scenario, n, level)["output_throughput"])] if built else []
            peers += [name for name in plan.LLAMA_SERVERS if name not in plan.GOAL_PEERS]
            for peer_name in peers:
                peer = get(scenario, peer_name, level)
                flags = plan.LLAMA_SERVERS[peer_name][1]
                shown = " ".join(flags)
                peer_label = f"llama-server `{shown}`" if flags else f"{peer_name} (the faster build)"
                for target, label in LLAMA_SERVER_LABELS.items():
                    ours = get(scenario, target, level)
                    if not (peer and ours):
                        continue
                    rows += _goal_rows(f"vs {peer_label}, {what}, c={level}, {label}", scenario, ours, peer)
    return rows


def _goal_rows(name: str, scenario: str, ours: dict[str, Any], peer: dict[str, Any]) -> list[TargetRow]:
    rows: list[TargetRow] = []
    if scenario == "llama-server":
        a, b = ours["output_throughput"], peer["output_throughput"]
        r = _ratio(a, b)
        rows.append(
            TargetRow(f"{name}: tokens/s", "≥ 1.0×", f"{a:.1f} vs {b:.1f} tok/s = {r:.2f}×", r >= 1.0)
        )
    a, b = ours["ttft_ms"]["p50"], peer["ttft_ms"]["p50"]
    r = _ratio(a, b)
    rows.append(TargetRow(f"{name}: TTFT p50", "≤ 1.1×", f"{a:,.0f} vs {b:,.0f} ms = {r:.2f}×", r <= 1.1))
    a, b = ours["itl_ms"]["p99"], peer["itl_ms"]["p99"]
    r = _ratio(a, b)
    rows.append(TargetRow(f"{name}: ITL p99", "≤ 1.5×", f"{a:,.0f} vs {b:,.0f} ms = {r:.2f}×", r <= 1.5))
    return rows


def _memory_vs_llama_server(record: dict[str, Any]) -> list[TargetRow]:
    """Issue 13's memory goal: the chat replica's RSS at most 1.2x llama-server's (same context x
    slots), both once up and after the new-prompts runs (each with its prompt cache as it grew)."""
    runs = record.get("scenarios", {}).get("llama-server", {}).get("runs", [])
    by_target = {r["target"]: r for r in runs}
    peer_start = record.get("rss_after_start_mb", {}).get("llama-server")
    peer_after = by_target.get("llama-server", {}).get("rss_after_runs_mb")
    rows: list[TargetRow] = []
    run, label = by_target.get("serve", {}), LLAMA_SERVER_LABELS["serve"]
    for when, peer, key in (
        ("once up", peer_start, "replica_rss_at_start_mb"),
        ("after the runs", peer_after, "replica_rss_mb"),
    ):
        chat = [r["rss_mb"] for r in run.get(key, []) if r["model"] == "llama.cpp chat"]
        if not (peer and chat):
            continue
        r = _ratio(max(chat), peer)
        rows.append(
            TargetRow(
                f"vs llama-server, chat replica RSS {when}, {label}",
                "≤ 1.2×",
                f"{max(chat):,.0f} vs {peer:,.0f} MB = {r:.2f}×",
                r <= 1.2,
            )
        )
    return rows


def as_json(rows: list[TargetRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def markdown_targets(rows: list[TargetRow]) -> str:
    mark = {True: "met", False: "**missed**", None: "—"}
    lines = ["| target | goal | measured | |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.target} | {r.goal} | {r.measured} | {mark[r.met]} |" for r in rows]
    return "\n".join(lines)


def _per_pass(forward: dict[str, float]) -> str:
    """bench/forward.py's split of a decode step: time inside llama.cpp (Raygate's counters) and
    wall time, per forward pass."""
    if not forward:
        return ""
    compute = forward.get("compute_ms_per_pass")
    wall = f"{forward['wall_ms_per_pass']:.1f}"
    return wall if compute is None else f"{compute:.1f} / {wall}"


def markdown_runs(record: dict[str, Any]) -> str:
    """Every (scenario, target, concurrency) cell: the numbers behind the targets."""
    lines = [
        (
            "| scenario | target | c | ok/sent | tok/s | req/s | TTFT p50 / p90 / p99 ms "
            "| ITL p50 / p99 ms | TPOT p50 ms | E2E p50 ms | failures | load "
            "| ms per pass: llama.cpp / wall |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, scenario in record.get("scenarios", {}).items():
        for run in sorted(scenario["runs"], key=lambda r: (r["concurrency"], r["target"])):
            s = run["summary"]
            t, i = s["ttft_ms"], s["itl_ms"]
            lines.append(
                f"| {name} | {run['target']} | {run['concurrency']} | {s['completed']}/{s['requests']} "
                f"| {s['output_throughput']:,.1f} | {s['request_throughput']:.2f} "
                f"| {t['p50']:.1f} / {t['p90']:.1f} / {t['p99']:.1f} | {i['p50']:.2f} / {i['p99']:.2f} "
                f"| {s['tpot_ms']['p50']:.2f} | {s['e2e_ms']['p50']:.0f} | {s['failures'] or ''} "
                f"| {run.get('loadavg', float('nan')):.1f} | {_per_pass(run.get('forward', {}))} |"
            )
    return "\n".join(lines)
