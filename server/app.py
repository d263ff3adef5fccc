"""The app factory. All state hangs off `app.state`, created in the lifespan: building two apps in
one process (tests do) shares nothing."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from backends import ray_cluster
from backends.registry import ModelRegistry
from server.errors import install_error_handlers
from server.requests import UnknownFieldLog
from server.routes import chat, completions, embeddings, models, tokenize
from server.settings import Settings, load_config

log = logging.getLogger(__name__)


def build_app(settings: Settings) -> FastAPI:
    config = load_config(settings.config_path)  # fail before Ray starts if the config is wrong

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ray_cluster.connect(settings.ray_address, settings.ray_num_cpus)
        registry = ModelRegistry(config, settings.config_path.parent)
        try:
            await registry.start()
            app.state.registry = registry
            log.info("serving %s", ", ".join(registry.model_ids()))
            yield
        finally:
            await registry.shutdown()
            ray_cluster.disconnect()

    app = FastAPI(
        title="Raygate",
        summary="OpenAI-compatible gateway serving LLMs on Ray.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.unknown_fields = UnknownFieldLog()
    install_error_handlers(app)
    for module in (chat, completions, embeddings, models, tokenize):
        app.include_router(module.router)
    return app
