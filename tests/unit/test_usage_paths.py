"""Every engine call of every endpoint takes one path out of the gateway (`ModelHandle._enter`):
a key's token budget is reserved before a generation, an embedding or a rank call reaches the
model, and each counts its usage (cached and reasoning tokens too) for the ledger. Without Ray: the
handle over a router of this process and the ledger's own class (tests/e2e/test_ledger.py runs the
same through gateways)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from raygate.backends.cluster.stores.ledger import Ledger
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import QuotaExceededError
from raygate.protocol.generation import (
    Delta,
    EmbedRequest,
    EmbedResult,
    GenerateRequest,
    RankRequest,
    RankResult,
    SamplingParams,
)
from raygate.protocol.ledger import KeyBudget
from raygate.protocol.model_limits import ModelLimits
from raygate.server.access.auth import ApiKey
from raygate.server.access.budgets import Budgets
from raygate.server.context import RequestContext
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.serving.admission import Admission
from raygate.server.serving.handle import ModelHandle
from raygate.server.settings import Settings

CONTEXT = 100  # the replicas' context: what one sequence, input or pair reserves
KEY = "key_1"


class InProcessLedger:
    """The ledger actor's methods called in this process: `LedgerClient.call`'s interface."""

    def __init__(self) -> None:
        self.ledger = Ledger(None, None)

    async def call(self, method: str, *args: Any) -> Any:
        return getattr(self.ledger, method)(*args)

    def held(self) -> int:
        return self.ledger._reserved.get(KEY, 0)


@dataclass
class Replica:
    context_length: int = CONTEXT


class Router:
    """`ModelRouter`'s interface; notes what the budget held while each call ran."""

    def __init__(self, ledger: InProcessLedger) -> None:
        self.config = ModelConfig(name="m", backend="synthetic", limits=ModelLimits())
        self.replicas = [Replica()]
        self.ledger = ledger
        self.held_during: list[int] = []

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        self.held_during.append(self.ledger.held())
        yield Delta("<think>", completion_tokens=3, prompt_tokens=5, cached_tokens=2, reasoning_tokens=3)
        yield Delta(
            "hi",
            completion_tokens=4,
            prompt_tokens=5,
            finish_reason="stop",
            cached_tokens=2,
            reasoning_tokens=3,
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        self.held_during.append(self.ledger.held())
        return EmbedResult([[1.0]] * len(request.inputs), prompt_tokens=6 * len(request.inputs))

    async def rank(self, request: RankRequest) -> RankResult:
        self.held_during.append(self.ledger.held())
        return RankResult([0.5] * len(request.pairs), prompt_tokens=7 * len(request.pairs))


def handle(ledger: InProcessLedger, router: Router, budget: KeyBudget) -> ModelHandle:
    loop = asyncio.get_running_loop()
    key = ApiKey("team", b"digest", None, None, id=KEY, budget=budget)
    ctx = RequestContext("req", loop.time(), key=key)
    ticket = Admission().gate("m", router.config.limits).enter()
    budgets = Budgets(ledger)  # type: ignore[arg-type]  # LedgerClient's interface, in-process
    return ModelHandle(router, ctx, ticket, GatewayMetrics(), Settings(), budgets=budgets)  # type: ignore[arg-type]


async def call(model: ModelHandle, kind: str, n: int) -> None:
    if kind == "generate":
        request = GenerateRequest("seq", SamplingParams(), prompt="hello")
        async for _ in model.generate(request):
            pass
    elif kind == "embed":
        await model.embed(EmbedRequest("emb", [f"text {i}" for i in range(n)]))
    else:
        await model.rank(RankRequest("rank", [("query", f"doc {i}") for i in range(n)]))


@pytest.mark.parametrize(
    ("kind", "n", "usage"),
    [
        # (calls, prompt, completion, cached, reasoning)
        ("generate", 1, (1, 5, 4, 2, 3)),
        ("embed", 3, (1, 18, 0, 0, 0)),
        ("rank", 4, (1, 28, 0, 0, 0)),
    ],
)
async def test_every_engine_call_reserves_its_most_before_the_model_and_counts_its_usage(
    kind: str, n: int, usage: tuple[int, ...]
) -> None:
    ledger = InProcessLedger()
    router = Router(ledger)
    model = handle(ledger, router, KeyBudget(tokens_per_day=10_000))
    await call(model, kind, n)
    most = CONTEXT * (1 if kind == "generate" else n)  # per sequence, per input, per pair
    assert router.held_during == [most]  # held before the call reached the model
    assert model.reserved == most  # the usage record trades it for the real tokens
    u = model.usage
    assert (u.calls, u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.reasoning_tokens) == usage


@pytest.mark.parametrize("kind", ["generate", "embed", "rank"])
async def test_a_budget_held_by_running_requests_stops_every_kind_of_call_before_the_model(kind: str) -> None:
    """Two running requests hold 200 of a 150-token budget: a third call of any kind is refused
    with `insufficient_quota` and never reaches the model, whatever its endpoint."""
    ledger = InProcessLedger()
    router = Router(ledger)
    budget = KeyBudget(tokens_per_day=150)
    for _ in range(2):  # running: their reservations are held until their usage is recorded
        await call(handle(ledger, router, budget), "rank", 1)
    assert ledger.held() == 2 * CONTEXT
    reached = len(router.held_during)
    third = handle(ledger, router, budget)
    with pytest.raises(QuotaExceededError) as refused:
        await call(third, kind, 1)
    assert refused.value.error_type == "insufficient_quota" and refused.value.status_code == 429
    assert len(router.held_during) == reached and third.usage.calls == 0 and third.reserved == 0


async def test_a_key_without_a_token_budget_holds_nothing() -> None:
    ledger = InProcessLedger()
    router = Router(ledger)
    model = handle(ledger, router, KeyBudget(max_parallel=2))
    await call(model, "rank", 2)
    assert router.held_during == [0] and model.reserved == 0 and model.usage.prompt_tokens == 14
