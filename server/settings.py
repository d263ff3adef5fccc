"""Process settings for `raygate serve`: where to listen, which models, which Ray cluster, and how
the gateway is operated (keys, limits, timeouts, shutdown). Every field has a CLI flag and an
environment variable (server/cli.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from protocol.config import GatewayConfig

# The default config sits next to the GGUF it names, in the repository's models/ folder.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "models" / "default.yaml"


DEFAULT_CORS_METHODS = ("GET", "POST", "OPTIONS")
DEFAULT_CORS_HEADERS = ("Authorization", "Content-Type", "X-Request-Id")


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    config_path: Path = DEFAULT_CONFIG
    ray_address: str | None = None
    ray_num_cpus: float | None = None
    log_level: str = "info"
    log_format: str = "text"  # or "json": one object per line, with the request id
    # Access: bearer keys (none = open), a YAML keys file, CORS.
    api_keys: tuple[str, ...] = ()
    api_keys_file: Path | None = None
    cors_origins: tuple[str, ...] = ()
    cors_methods: tuple[str, ...] = DEFAULT_CORS_METHODS
    cors_headers: tuple[str, ...] = DEFAULT_CORS_HEADERS
    # Limits and timeouts (a model's `limits:` block overrides the timeouts).
    max_body_bytes: int = 8 * 1024 * 1024
    ttft_timeout_s: float | None = None
    request_timeout_s: float | None = None
    sse_ping_s: float = 15.0
    # SIGTERM: seconds in-flight requests get to finish before they are ended with an error.
    drain_timeout_s: float = 30.0


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
