"""Process settings for `raygate serve`: where to listen, which models, which Ray cluster."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from protocol.config import GatewayConfig

# The default config sits next to the GGUF it names, in the repository's models/ folder.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "models" / "default.yaml"


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    config_path: Path = DEFAULT_CONFIG
    ray_address: str | None = None
    ray_num_cpus: float | None = None
    log_level: str = "info"


class ConfigError(ValueError):
    """The models config cannot be read or does not validate."""


def load_config(path: Path) -> GatewayConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid config {path}:\n{exc}") from exc
