"""A model's `limits:` block: how many requests it admits, and how long each may take.

Its own room because the gateway's admission (server/serving/admission.py) reads it on every
request, apart from what the replicas load; its `None`s fall back to the gateway's defaults.
"""

from __future__ import annotations

from pydantic import Field

from raygate.protocol.base import StrictModel


class ModelLimits(StrictModel):
    """Admission and time limits for one model; `None` means unbounded (or: use the gateway default).

    A request is *running* once it has been handed to the model's replicas and *waiting* while it
    queues in the gateway for a running slot. Past `max_running + max_waiting` the gateway answers
    429 with `Retry-After` before anything reaches the engine.
    """

    max_running: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Requests handed to the replicas at once (all replicas together).",
    )
    max_waiting: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="Requests that may queue in the gateway once `max_running` is reached.",
    )
    ttft_timeout_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds from arrival to the first token (default: the gateway's).",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds from arrival to the end of the response (default: the gateway's).",
    )
    max_documents: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Documents one rerank request (or pairs one score request) may send; more is a 400.",
    )
