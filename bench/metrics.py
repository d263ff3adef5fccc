"""Per-request timings and their summary, defined as `vllm bench serve` defines them.

* TTFT: request sent -> first chunk that carries generated text (a role-only chunk does not count).
* ITL: gaps between consecutive text-carrying chunks (several tokens in one chunk give one gap).
* TPOT: (E2E - TTFT) / (output tokens - 1), per request; requests with one token have none.
* E2E: request sent -> end of stream.
* Throughput: completed requests and output tokens over the wall time of the whole run.

Pure functions over plain data, so the arithmetic is unit-tested without a server.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestResult:
    """What one request did. Times are seconds on the client's `perf_counter` clock."""

    sent: float
    ok: bool = False
    status: str = ""  # "200", "500", "timeout", "connection", "stream_error", "incomplete"
    first_token: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    end: float | None = None
    output_tokens: int = 0
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.sent

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.chunk_times)]

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), so numbers match vLLM's."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution_ms(values: Sequence[float]) -> dict[str, float]:
    """Mean and percentiles, in milliseconds."""
    out = {"mean": (sum(values) / len(values) * 1000) if values else math.nan}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q) * 1000
    return out


@dataclass(slots=True)
class Summary:
    """One (target, concurrency) run reduced to vLLM's benchmark metrics: distributions over completed
    requests only, failures counted by status."""

    requests: int
    completed: int
    failures: dict[str, int]
    duration_s: float
    output_tokens: int
    request_throughput: float
    output_throughput: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: Sequence[RequestResult], duration_s: float | None = None) -> Summary:
    """`duration_s` defaults to first send -> last end; pass it when rounds were interleaved with
    other targets' runs, so their time does not count against this one."""
    done = [r for r in results if r.ok]
    if duration_s is None:
        ends = [r.end for r in results if r.end is not None]
        duration_s = (max(ends) - min(r.sent for r in results)) if ends else 0.0
    tokens = sum(r.output_tokens for r in done)
    failures = Counter(r.status for r in results if not r.ok)
    per = duration_s if duration_s > 0 else math.nan
    return Summary(
        requests=len(results),
        completed=len(done),
        failures=dict(sorted(failures.items())),
        duration_s=duration_s,
        output_tokens=tokens,
        request_throughput=len(done) / per,
        output_throughput=tokens / per,
        ttft_ms=distribution_ms([r.ttft for r in done if r.ttft is not None]),
        tpot_ms=distribution_ms([r.tpot for r in done if r.tpot is not None]),
        itl_ms=distribution_ms([gap for r in done for gap in r.itls]),
        e2e_ms=distribution_ms([r.e2e for r in done if r.e2e is not None]),
    )
