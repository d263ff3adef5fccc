"""The models config file, as `raygate serve` starts from it: read and validated, its models'
relative paths made absolute, and their weights and the state directory checked before Ray starts;
and the built-in models of models/default.yaml. Its own module because it reads files and knows the
engines' options and the registry's files, which the settings themselves do not."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from raygate.backends.cluster.control.registrations import load_registrations
from raygate.backends.cluster.stores.state_file import StateFileError, load_specs, state_file
from raygate.backends.engines.model_files import (
    ModelFileError,
    anchor_source,
    resolve_adapter,
    resolve_model_file,
)
from raygate.backends.engines.options import check_engine_options
from raygate.protocol.base import describe_errors
from raygate.protocol.config import GatewayConfig, ModelConfig
from raygate.server.settings import DEFAULT_CONFIG, ConfigError, Settings


def load_config(path: Path) -> GatewayConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid config {path}:\n{describe_errors(exc)}") from None


def builtin_specs() -> list[ModelConfig]:
    """The default models (models/default.yaml): what Xinference's API lists as built-in
    registrations, because Raygate can load them offline. None when the file is not there."""
    try:
        config = load_config(DEFAULT_CONFIG)
    except ConfigError:
        return []
    return [
        m.model_copy(update={"source": m.source and anchor_source(m.source, DEFAULT_CONFIG.parent)})
        for m in config.models
    ]


def seed_specs(config: GatewayConfig, settings: Settings) -> list[ModelConfig]:
    """The config's models as deployment specs, with relative paths made absolute.

    When they will seed a new registry (no registry file yet), weights that cannot be found stop
    the start here, before Ray starts (a persisted registry overrides the config, whose weights
    are then not used). A misspelt `engine:` key stops it either way: the file is wrong.
    """
    base = settings.config_path.parent
    specs = [
        m.model_copy(
            update={
                "source": m.source and anchor_source(m.source, base),
                "adapters": [
                    a.model_copy(update={"source": anchor_source(a.source, base)}) for a in m.adapters
                ],
            }
        )
        for m in config.models
    ]
    for spec in specs:  # a typo in the file is an error even where a persisted registry wins
        try:
            check_engine_options(spec)
        except ValueError as exc:
            raise ConfigError(f"model `{spec.name}` in {settings.config_path}: {exc}") from exc
    if settings.state_dir is not None:
        _check_state_dir(settings.state_dir)
        if state_file(settings.state_dir).exists():
            return specs
    for spec in specs:
        if spec.source is not None and spec.source.hub is None and spec.backend != "synthetic":
            try:
                resolve_model_file(spec.source, folder=spec.backend == "vllm")
            except ModelFileError as exc:
                raise ConfigError(f"model `{spec.name}` in {settings.config_path}: {exc}") from exc
        for adapter in (a for a in spec.adapters if a.source.hub is None):  # a Hub's: at deploy
            try:
                resolve_adapter(adapter.source, spec.backend)
            except ModelFileError as exc:
                raise ConfigError(
                    f"adapter `{adapter.name}` of `{spec.name}` in {settings.config_path}: {exc}"
                ) from exc
    return specs


def _check_state_dir(state_dir: Path) -> None:
    """A registry that cannot be read or written is found here, before Ray starts, rather than as
    a controller that fails to start."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        load_specs(state_dir)
        load_registrations(state_dir)
    except StateFileError as exc:
        raise ConfigError(f"{exc}\n(fix or delete it; without it the config seeds a new registry)") from exc
    except OSError as exc:
        raise ConfigError(f"cannot use state directory {state_dir}: {exc}") from exc
    if not os.access(state_dir, os.W_OK):
        raise ConfigError(f"cannot write to state directory {state_dir}")
