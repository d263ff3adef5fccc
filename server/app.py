"""The app factory. All state hangs off `app.state`, created in the lifespan: building two apps in
one process (tests do) shares nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from raygate.backends.cluster.control.controller import connect_controller
from raygate.backends.cluster.control.controller_client import ControllerClient
from raygate.backends.cluster.runtime import connection as ray_connection
from raygate.backends.cluster.runtime.tracing import TracingUnavailableError, shutdown_providers
from raygate.backends.cluster.stores.batches import BatchStoreClient
from raygate.backends.cluster.stores.host import StoreSettings, connect_stores
from raygate.backends.cluster.stores.ledger import LedgerClient
from raygate.backends.cluster.stores.responses import ResponseStoreClient
from raygate.backends.heap import freeze_startup_heap
from raygate.server.access.auth import KeyStore
from raygate.server.access.budgets import Budgets
from raygate.server.access.key_sync import KeySync
from raygate.server.config_file import builtin_specs, load_config, seed_specs
from raygate.server.observability.ledger_writer import LedgerWriter
from raygate.server.observability.metrics import GatewayMetrics
from raygate.server.observability.metrics_history import MetricsHistory
from raygate.server.observability.tracing import Tracing
from raygate.server.observability.usage_metrics import KeyLabels
from raygate.server.routes import (
    admin,
    batches,
    chat,
    completions,
    embeddings,
    files,
    ledger,
    lora,
    messages,
    models,
    ollama,
    ops,
    rerank,
    responses,
    tokenize,
    ui,
    xinference,
)
from raygate.server.serving.admission import Admission, ModelGate
from raygate.server.serving.batch_runner import BatchRunner
from raygate.server.settings import ConfigError, Settings
from raygate.server.transport.errors import install_error_handlers
from raygate.server.transport.lifecycle import Lifecycle
from raygate.server.transport.middleware import GatewayMiddleware
from raygate.server.transport.openapi import install_openapi
from raygate.server.transport.unknown_fields import UnknownFieldLog

log = logging.getLogger(__name__)

# Model loads are bounded by the controller's own load timeout; this only caps the wait for them.
STARTUP_SETTLE_SECONDS = 3600.0


def _stop_this_process() -> None:
    """The Ray cluster is gone (ControllerClient): shut down as on `docker stop`, so that a restart
    policy brings the gateway back into the cluster that replaces it."""
    os.kill(os.getpid(), signal.SIGTERM)


def build_app(settings: Settings) -> FastAPI:
    # Fail before Ray starts if the config is wrong or names weights that are not there.
    seed = seed_specs(load_config(settings.config_path), settings)
    builtins = builtin_specs()
    keys = KeyStore.from_settings(settings.api_keys, settings.api_keys_file, settings.admin_key)
    if settings.database_url:
        # Only with a database URL: otherwise the gateway never loads SQLAlchemy (ledger_records.py).
        from raygate.backends.cluster.stores.ledger_db import database_problem

        if problem := database_problem(settings.database_url):
            raise ConfigError(problem)
    tracing = None
    if settings.otlp_traces_endpoint:
        try:
            tracing = Tracing(settings.otlp_traces_endpoint)
        except TracingUnavailableError as exc:
            raise ConfigError(f"--otlp-traces-endpoint: {exc}") from None
    metrics = GatewayMetrics()
    history = MetricsHistory()
    lifecycle = Lifecycle(drain_timeout_s=settings.drain_timeout_s)

    def controller() -> Any:
        return connect_controller(settings.state_dir, seed, builtins, settings.state_resource)

    store_settings = StoreSettings(
        state_dir=settings.state_dir,
        responses_max_age_s=settings.responses_max_age_s,
        responses_max_bytes=settings.responses_max_bytes,
        batch_window_s=settings.batch_window_s,
        database_url=settings.database_url,
    )

    def stores() -> Any:
        return connect_stores(store_settings, settings.state_resource)

    ledger_client = LedgerClient(stores)
    writer = LedgerWriter(ledger_client.call)
    key_sync = KeySync(keys, ledger_client)
    budgets = Budgets(ledger_client)

    def gate_changed(gate: ModelGate) -> None:
        metrics.set_queue(gate.name, gate.running, gate.waiting)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ray_connection.connect(
            settings.ray_address,
            settings.ray_num_cpus,
            settings.ray_namespace,
            dashboard=settings.ray_dashboard,
            agents=settings.ray_agents,
        )
        cluster = ControllerClient(controller, on_lost=_stop_this_process)
        cluster.queued = admission.waiting  # autoscaling counts requests queued here as load
        sampler: asyncio.Task[None] | None = None
        ledger_tasks: list[asyncio.Task[None]] = []
        runner: BatchRunner | None = None
        try:
            info = await cluster.start()
            _log_origin(info, settings)
            for status in await cluster.wait_settled(STARTUP_SETTLE_SECONDS):
                if status.state != "ready":
                    log.error("model %s is %s: %s", status.name, status.state, status.error)
            app.state.cluster = cluster
            app.state.responses = ResponseStoreClient(stores)
            _log_store(await app.state.responses.start(), settings)
            log.info("usage, API keys and audit log in %s", (await ledger_client.start())["where"])
            await key_sync.refresh()
            ledger_tasks = [asyncio.create_task(writer.run()), asyncio.create_task(key_sync.run())]
            app.state.batches = BatchStoreClient(stores)
            log.info(
                "files and batches in %s",
                (await app.state.batches.start())["path"] or "the stores actor's memory",
            )
            if settings.batch_max_running > 0:
                runner = app.state.batch_runner = BatchRunner(
                    app,
                    app.state.batches,
                    keys=keys,
                    admission=admission,
                    lifecycle=lifecycle,
                    metrics=metrics,
                    max_running=settings.batch_max_running,
                    lease_s=settings.batch_lease_s,
                )
                runner.start()
            for router in cluster.routers():  # gauges read 0, not "absent", before any traffic
                admission.gate(router.config.name, router.config.limits)
                metrics.set_queue(router.config.name, 0, 0)
            log.info("serving %s", ", ".join(cluster.model_ids()) or "no model yet")
            sampler = asyncio.create_task(history.run(metrics, cluster.routers))
            log.info("web console at http://%s:%d/ui", settings.host, settings.port)
            freeze_startup_heap()  # as vLLM's server: no full collection walks the startup heap
            yield
        finally:
            if runner is not None:  # hands its unfinished lines back to the batch store
                await runner.stop()
            if sampler is not None:  # the console's charts (server/observability/metrics_history.py)
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            for task in ledger_tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if ledger_tasks:  # what the last requests used, written before Ray goes
                await _close_ledger(writer, budgets)
            await cluster.shutdown()
            ray_connection.disconnect()
            shutdown_providers()  # the last spans exported (nothing to do with tracing off)

    app = FastAPI(
        title="Raygate",
        summary="OpenAI-compatible gateway serving LLMs on Ray.",
        lifespan=lifespan,
    )
    admission = Admission(on_change=gate_changed)
    app.state.settings = settings
    app.state.unknown_fields = UnknownFieldLog()
    app.state.keys = keys
    app.state.metrics = metrics
    app.state.metrics_history = history
    app.state.lifecycle = lifecycle
    app.state.admission = admission
    app.state.ledger = ledger_client
    app.state.ledger_writer = writer
    app.state.budgets = budgets
    app.state.key_sync = key_sync
    app.state.key_labels = KeyLabels(settings.usage_metrics_keys)
    install_error_handlers(app)
    install_openapi(app)
    # xinference before models: its `/v1/models/prompts` must win over `/v1/models/{id:path}`.
    for module in (
        chat,
        completions,
        embeddings,
        rerank,
        messages,
        xinference,
        models,
        admin,
        ledger,
        lora,
        ops,
        tokenize,
        responses,
        ollama,
        files,
        batches,
        ui,
    ):
        app.include_router(module.router)
    app.add_middleware(
        GatewayMiddleware,
        keys=keys,
        metrics=metrics,
        lifecycle=lifecycle,
        max_body_bytes=settings.max_body_bytes,
        budgets=budgets,
        audit=writer,
        admin_actor="admin" if settings.admin_key else "anonymous",
        max_upload_bytes=settings.files_max_bytes,
        tracing=tracing,
    )
    if settings.cors_origins:  # outermost, so preflights and error responses get CORS headers
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=list(settings.cors_methods),
            allow_headers=list(settings.cors_headers),
            expose_headers=["X-Request-Id", "Retry-After"],
        )
    return app


async def _close_ledger(writer: LedgerWriter, budgets: Budgets) -> None:
    try:
        await budgets.close()
        await writer.close()
    except Exception as exc:
        log.error("usage not written to the ledger at shutdown (%d records): %s", writer.pending, exc)


def _log_origin(info: dict[str, Any], settings: Settings) -> None:
    """Say where the registry came from: operators otherwise wonder why a config edit did nothing."""
    if info["restored"]:
        log.info(
            "registry restored from %s/registry.json; %s is not used", info["state_dir"], settings.config_path
        )
    elif info["state_dir"] is None:
        log.info("registry not persisted (no --state-dir): changes last until the controller stops")
    if settings.state_dir is not None and str(settings.state_dir) != info["state_dir"]:
        log.warning(
            "attached to a running controller that persists to %s, not to --state-dir %s",
            info["state_dir"],
            settings.state_dir,
        )
    log.info(
        "controller on node %s holds: %s", info["node_id"][:12], ", ".join(info["deployments"]) or "nothing"
    )


def _log_store(info: dict[str, Any], settings: Settings) -> None:
    """Say where stored responses live; the first gateway of a namespace decides (like the registry)."""
    log.info("stored responses (POST /v1/responses) in %s", info["path"] or "the stores actor's memory")
    wanted = settings.state_dir
    if wanted is not None and info["path"] is not None and not info["path"].startswith(str(wanted)):
        log.warning("attached to a response store in %s, not in --state-dir %s", info["path"], wanted)
