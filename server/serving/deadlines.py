"""`Deadlines`: a request's time-to-first-token and total deadlines, and the errors of their expiry.

Its own room because every engine call of a `ModelHandle` (server/serving/handle.py) waits under
them, the admission wait included, and a batch line moves them to its slot: which limit applies
(the model's `limits:` over the gateway's settings) and which deadline comes first is one idea.
"""

from __future__ import annotations

from collections.abc import Callable

from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import GatewayTimeoutError, OpenAIError
from raygate.server.settings import Settings


def _earliest(*deadlines: float | None) -> float | None:
    present = [d for d in deadlines if d is not None]
    return min(present) if present else None


class Deadlines:
    """The deadlines (loop time; None: no limit) of one request to one model."""

    def __init__(self, config: ModelConfig, settings: Settings, started: float) -> None:
        self._name = config.name
        limits = config.limits
        ttft = limits.ttft_timeout_s or settings.ttft_timeout_s
        total = limits.request_timeout_s or settings.request_timeout_s
        self._ttft_s, self._total_s = ttft, total
        self.ttft = None if ttft is None else started + ttft
        self.total = None if total is None else started + total

    def restart(self, now: float) -> None:
        """Count both deadlines from `now` (a batch line's slot)."""
        if self._ttft_s is not None:
            self.ttft = now + self._ttft_s
        if self._total_s is not None:
            self.total = now + self._total_s

    def first_token(self) -> tuple[float | None, Callable[[], OpenAIError]]:
        """The deadline of a wait before the first token (the earlier of the two), and its error."""
        deadline = _earliest(self.ttft, self.total)
        expired = self.ttft_expired if deadline == self.ttft else self.total_expired
        return deadline, expired

    def ttft_expired(self) -> OpenAIError:
        return GatewayTimeoutError(
            f"Model `{self._name}` produced no token within {self._ttft_s:g} s.", code="ttft_timeout"
        )

    def total_expired(self) -> OpenAIError:
        return GatewayTimeoutError(
            f"Model `{self._name}` did not finish within {self._total_s:g} s.", code="request_timeout"
        )
