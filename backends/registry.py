"""The models this gateway serves: one `ModelRouter` per configured model, found by name or alias."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import ray

from backends.model_files import anchor_source
from backends.router import ModelRouter, Replica
from backends.worker import ModelWorker
from protocol.config import GatewayConfig, ModelConfig
from protocol.errors import ModelNotFoundError

log = logging.getLogger(__name__)


class ReplicaStartError(RuntimeError):
    """A replica could not load its model; the message says which and why."""


class ModelRegistry:
    def __init__(self, config: GatewayConfig, base_dir: Path) -> None:
        self._models = [
            m.model_copy(update={"source": m.source and anchor_source(m.source, base_dir)})
            for m in config.models
        ]
        self._routers: dict[str, ModelRouter] = {}
        self._by_id: dict[str, ModelRouter] = {}
        self.created = int(time.time())

    async def start(self) -> None:
        """Start every replica of every model at once; any failure stops the gateway's start."""
        routers = await asyncio.gather(*(self._start_model(m) for m in self._models))
        for router in routers:
            self._routers[router.config.name] = router
            for model_id in router.config.ids:
                self._by_id[model_id] = router

    async def _start_model(self, config: ModelConfig) -> ModelRouter:
        actor_cls = ray.remote(ModelWorker)
        actors = [
            actor_cls.options(
                name=f"raygate:{config.name}:{i}:{id(self):x}",
                num_cpus=config.num_cpus,
                num_gpus=config.num_gpus,
                resources=config.resources or None,
                runtime_env={"env_vars": config.env} if config.env else None,
            ).remote(config)
            for i in range(config.replicas)
        ]
        t0 = time.monotonic()
        results = await asyncio.gather(*(a.start.remote() for a in actors), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for actor in actors:
                ray.kill(actor)
            cause = getattr(failures[0], "cause", None) or failures[0]
            raise ReplicaStartError(f"model `{config.name}` failed to start: {cause}")
        replicas = [
            Replica(actor=a, index=i, node_id=r["node_id"], context_length=r["context_length"])
            for i, (a, r) in enumerate(zip(actors, results, strict=True))
        ]
        log.info(
            "model %s ready: %d replica(s) in %.1fs", config.name, len(replicas), time.monotonic() - t0
        )
        return ModelRouter(config, replicas)

    def get(self, model_id: str) -> ModelRouter:
        router = self._by_id.get(model_id)
        if router is None:
            raise ModelNotFoundError.for_model(model_id)
        return router

    def model_ids(self) -> list[str]:
        return list(self._by_id)

    def routers(self) -> list[ModelRouter]:
        return list(self._routers.values())

    async def shutdown(self) -> None:
        for router in self._routers.values():
            for replica in router.replicas:
                ray.kill(replica.actor)
        self._routers.clear()
        self._by_id.clear()
