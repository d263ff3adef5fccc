"""Prometheus metrics, named and shaped like vLLM's (`vllm:time_to_first_token_seconds` here is
`raygate:time_to_first_token_seconds`) and labelled by `model_name`, so dashboards built for vLLM
carry over and a gateway in front of vLLM can be scraped next to it without clashes.

Each app owns its `Registry`: aioprometheus' global one refuses a second registration of the same
name, which a second app in one process (tests) would trigger.
"""

from __future__ import annotations

import asyncio

from aioprometheus import Counter, Gauge, Histogram, Registry, render

from raygate.backends.cluster.routing.router import ModelRouter
from raygate.backends.engines.base import EngineStats

# vLLM's buckets (vllm/v1/metrics/loggers.py), so the histograms line up with its dashboards.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

PREFIX = "raygate:"


class GatewayMetrics:
    """The gateway's Prometheus metrics, on this app's own registry; the serving layer and middleware update
    them, and `/metrics` renders them."""

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self.ttft = Histogram(
            f"{PREFIX}time_to_first_token_seconds",
            "Seconds from arrival to the first token, queue time included.",
            registry=r,
            buckets=TTFT_BUCKETS,
        )
        self.tpot = Histogram(
            f"{PREFIX}time_per_output_token_seconds",
            "Mean seconds between output tokens after the first, per sequence.",
            registry=r,
            buckets=TPOT_BUCKETS,
        )
        self.e2e = Histogram(
            f"{PREFIX}e2e_request_latency_seconds",
            "Seconds from arrival to the last token of a sequence.",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.queue_time = Histogram(
            f"{PREFIX}request_queue_time_seconds",
            "Seconds a request waited in the gateway for a running slot.",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens_total", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens_total", "Tokens generated.", registry=r)
        self.success = Counter(
            f"{PREFIX}request_success_total", "Sequences that finished, by finish reason.", registry=r
        )
        self.http_requests = Counter(
            f"{PREFIX}http_requests_total", "HTTP requests by endpoint, status code and model.", registry=r
        )
        # Per LoRA adapter (docs/lora.md): labels `model_name` (the base) and `lora_name`.
        self.lora_sequences = Counter(
            f"{PREFIX}lora_sequences_total", "Sequences that finished, by LoRA adapter.", registry=r
        )
        self.lora_generation_tokens = Counter(
            f"{PREFIX}lora_generation_tokens_total", "Tokens generated, by LoRA adapter.", registry=r
        )
        self.rejected = Counter(
            f"{PREFIX}requests_rejected_total",
            "Requests refused before reaching an engine, by reason.",
            registry=r,
        )
        self.running = Gauge(
            f"{PREFIX}num_requests_running", "Requests handed to the model's replicas.", registry=r
        )
        self.waiting = Gauge(
            f"{PREFIX}num_requests_waiting", "Requests queued in the gateway for a running slot.", registry=r
        )
        self.replicas_ready = Gauge(f"{PREFIX}replicas_ready", "Replicas in rotation per model.", registry=r)
        self.replica_restarts = Counter(
            f"{PREFIX}replica_restarts_total", "Replicas replaced after their actor died.", registry=r
        )
        self.replicas_desired = Gauge(
            f"{PREFIX}replicas_desired",
            "Replicas the model aims at: its fixed count, or the autoscaler's latest choice.",
            registry=r,
        )
        # Per API key (bounded: `KeyLabels`), from the usage each request records.
        self.key_prompt_tokens = Counter(
            f"{PREFIX}key_prompt_tokens_total", "Prompt tokens per API key id.", registry=r
        )
        self.key_generation_tokens = Counter(
            f"{PREFIX}key_generation_tokens_total", "Generated tokens per API key id.", registry=r
        )
        self.key_requests = Counter(
            f"{PREFIX}key_requests_total", "Requests that reached a model, per API key id.", registry=r
        )
        self.scaling_events = Counter(
            f"{PREFIX}scaling_events_total",
            "Changes of the desired replica count (autoscaler or admin), cluster-wide.",
            registry=r,
        )
        self.download_bytes = Gauge(
            f"{PREFIX}model_download_bytes",
            "A Hub download in progress (the least advanced of the model's loading replicas): "
            "`kind` done or total; 0 when none runs.",
            registry=r,
        )
        self.download_rate = Gauge(
            f"{PREFIX}model_download_bytes_per_second",
            "Mean rate of that download since its replica started; 0 when none runs.",
            registry=r,
        )
        self.waiting_for_replica = Gauge(
            f"{PREFIX}num_requests_waiting_for_replica",
            "Requests held while an autoscaled model at zero replicas starts one.",
            registry=r,
        )
        self.affinity = Counter(
            f"{PREFIX}routing_affinity_total",
            "Prefix-affinity routing outcomes in this gateway: hit (the replica that served the "
            "prefix), fallback (it was too loaded: least-loaded instead), miss (no known prefix, or one "
            "every replica served).",
            registry=r,
        )
        self.batches = Gauge(
            f"{PREFIX}batches", "Batches (/v1/batches) in the cluster, by status.", registry=r
        )
        self.batch_lines = Counter(
            f"{PREFIX}batch_lines_total",
            "Batch lines this gateway ran, by outcome: completed, failed (in the error file), "
            "retried (a server error, run once more).",
            registry=r,
        )
        self.draining = Gauge(f"{PREFIX}draining", "1 while the gateway drains for shutdown.", registry=r)
        # The llama.cpp engines' prompt cache and forward passes, summed over the model's ready
        # replicas at scrape time.
        self.engine_counters = {
            field: Counter(f"{PREFIX}{field}", help_, registry=r)
            for field, help_ in (
                ("prompt_cache_hits_total", "Requests whose prompt reused a cached prefix."),
                ("prompt_cache_misses_total", "Requests whose prompt was evaluated whole."),
                ("prompt_cache_reused_tokens_total", "Prompt tokens taken from the prompt cache."),
                (
                    "prompt_cache_restored_total",
                    "Requests whose cached prefix came back from host memory (an evicted slot's state).",
                ),
                (
                    "prompt_cache_logits_reused_total",
                    "Requests whose prompt came before: the first token from its kept logits, no decode.",
                ),
                (
                    "preemptions_total",
                    "Running sequences whose slot went to a waiting request of a better class (a batch "
                    "line's, to an interactive request); each resumes where it stopped.",
                ),
                ("forward_passes_total", "llama.cpp forward passes (llama_decode calls)."),
                (
                    "forward_tokens_total",
                    "Tokens the llama.cpp forward passes evaluated (prompts and outputs).",
                ),
                (
                    "forward_seconds_total",
                    "Seconds inside llama.cpp forward passes; per pass, against wall time, the compute "
                    "share of serving.",
                ),
            )
        }

    def set_queue(self, model: str, running: int, waiting: int) -> None:
        labels = {"model_name": model}
        self.running.set(labels, running)
        self.waiting.set(labels, waiting)

    def observe_replicas(self, routers: list[ModelRouter]) -> None:
        """Replica counts live in the routers; copy them in at scrape time."""
        for router in routers:
            labels = {"model_name": router.config.name}
            self.replicas_ready.set(labels, len(router.replicas))
            self.replica_restarts.set(labels, router.restarts)
            self.replicas_desired.set(labels, router.desired)
            self.scaling_events.set(labels, router.scaling_events_total)
            self.waiting_for_replica.set(labels, router.waiting)
            download = router.download
            self.download_bytes.set({**labels, "kind": "done"}, download.bytes_done if download else 0)
            self.download_bytes.set({**labels, "kind": "total"}, download.bytes_total if download else 0)
            self.download_rate.set(labels, download.bytes_per_s if download else 0)
            if router.config.routing.policy == "prefix_affinity":
                for outcome in ("hit", "fallback", "miss"):
                    self.affinity.set({**labels, "outcome": outcome}, getattr(router.affinity, outcome))

    async def observe_engines(self, routers: list[ModelRouter], timeout: float = 2.0) -> None:
        """Engine counters live in the replicas: ask each ready one, and sum them per model. A
        replica that does not answer within `timeout` is left out of this scrape."""
        for router in routers:
            calls = [replica.actor.stats.remote() for replica in router.replicas]
            try:
                done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout)
            except TimeoutError:
                continue
            stats = [s for s in done if isinstance(s, EngineStats)]
            labels = {"model_name": router.config.name}
            for field, counter in self.engine_counters.items():
                counter.set(labels, sum(getattr(s, field) for s in stats))

    def render(self, accept: list[str]) -> tuple[bytes, dict[str, str]]:
        content, headers = render(self.registry, accept)
        return content, dict(headers)
