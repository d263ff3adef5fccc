"""Ladder step L1: Raygate's own HTTP layer (routes, SSE, error table) with the engines in this
process instead of behind Ray. The difference between L1 and L2 is the Ray hop; between L0 and L1,
HTTP + SSE.

Only the controller client differs from `raygate.server.app.build_app`: engines are made by the same
`raygate.backends.engines.factory.make_engine` from the same config file, and each model's requests go to its
least-loaded engine, as `ModelRouter` does with replicas.

    python -m bench.inproc_app --config bench/configs/bench.yaml --port 8123
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from raygate.backends.engines.base import Engine
from raygate.backends.engines.factory import make_engine
from raygate.backends.engines.model_files import anchor_source
from raygate.protocol.config import ModelConfig
from raygate.protocol.errors import ModelNotFoundError
from raygate.protocol.generation import Delta, GenerateRequest
from raygate.protocol.sampling_defaults import SamplingDefaults
from raygate.server.access.auth import KeyStore
from raygate.server.config_file import load_config
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.routes import chat, completions, models
from raygate.server.serving.admission import Admission
from raygate.server.settings import Settings
from raygate.server.transport.errors import install_error_handlers
from raygate.server.transport.lifecycle import Lifecycle
from raygate.server.transport.middleware import GatewayMiddleware
from raygate.server.transport.unknown_fields import UnknownFieldLog


class InProcessRouter:
    """`ModelRouter`'s interface over engines held in this process."""

    def __init__(self, config: ModelConfig, engines: list[Engine]) -> None:
        self.config = config
        self._engines = engines
        # Admission sizes the model's gate by slots per replica times this list's length, as for Ray's.
        self.replicas = engines
        self._inflight = [0] * len(engines)
        self._tiebreak = itertools.count()

    def sampling_defaults(self) -> SamplingDefaults:
        """The deployment's `defaults:` (no replica here reads a generation config)."""
        return self.config.defaults

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        low = min(self._inflight)
        candidates = [i for i, n in enumerate(self._inflight) if n == low]
        index = candidates[next(self._tiebreak) % len(candidates)]
        self._inflight[index] += 1
        try:
            async for delta in self._engines[index].generate(request):
                yield delta
        finally:
            self._inflight[index] -= 1


class InProcessRegistry:
    """`ControllerClient`'s read side, which is all the routes use."""

    def __init__(self, routers: list[InProcessRouter]) -> None:
        self._by_id = {model_id: r for r in routers for model_id in r.config.ids}
        self.created = int(time.time())

    def get(self, model_id: str) -> InProcessRouter:
        router = self._by_id.get(model_id)
        if router is None:
            raise ModelNotFoundError.for_model(model_id)
        return router

    def adapter(self, model_id: str) -> None:
        """No LoRA adapters here: every id is a model's own (None)."""

    def model_ids(self) -> list[str]:
        return list(self._by_id)


async def _start_engines(config: ModelConfig, base_dir: Path) -> InProcessRouter:
    config = config.model_copy(update={"source": config.source and anchor_source(config.source, base_dir)})
    engines = [make_engine(config) for _ in range(config.replicas)]
    for engine in engines:
        await engine.start()
    return InProcessRouter(config, engines)


def build_app(config_path: Path) -> FastAPI:
    config = load_config(config_path)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        routers = [await _start_engines(m, config_path.parent) for m in config.models if m.task == "generate"]
        app.state.cluster = InProcessRegistry(routers)
        yield

    app = FastAPI(title="Raygate L1 (no Ray)", lifespan=lifespan)
    # The same request machinery as `raygate.server.app.build_app` (admission, metrics, middleware), so
    # L1 differs from L2 by the Ray hop only.
    settings = Settings(config_path=config_path)
    keys = KeyStore.from_settings(settings.api_keys, settings.api_keys_file)
    metrics = GatewayMetrics()
    lifecycle = Lifecycle(drain_timeout_s=settings.drain_timeout_s)
    app.state.settings = settings
    app.state.unknown_fields = UnknownFieldLog()
    app.state.keys = keys
    app.state.metrics = metrics
    app.state.lifecycle = lifecycle
    app.state.admission = Admission(
        on_change=lambda gate: metrics.set_queue(gate.name, gate.running, gate.waiting)
    )
    install_error_handlers(app)
    for module in (chat, completions, models):
        app.include_router(module.router)
    app.add_middleware(
        GatewayMiddleware,
        keys=keys,
        metrics=metrics,
        lifecycle=lifecycle,
        max_body_bytes=settings.max_body_bytes,
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="info")  # the same as `raygate serve`'s default
    # uvicorn's defaults, as `raygate serve` uses them ("auto": uvloop and httptools when
    # installed, which uvicorn[standard] does); other values measure what those levers bring.
    parser.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    parser.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"])
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    app = build_app(args.config.resolve())
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, loop=args.loop, http=args.http)


if __name__ == "__main__":
    main()
