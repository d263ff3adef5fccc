"""Process settings for `raygate serve`: where to listen, which models, which Ray cluster, and how
the gateway is operated (keys, limits, timeouts, shutdown), and where the registry is persisted.
Every field has a CLI flag and an environment variable (server/cli.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from raygate.backends.cluster.control.registrations import load_registrations
from raygate.backends.cluster.stores.state_file import StateFileError, load_specs, state_file
from raygate.backends.engines.model_files import ModelFileError, anchor_source, resolve_model_file
from raygate.protocol.base import describe_errors
from raygate.protocol.config import GatewayConfig, ModelConfig

# The default config sits next to the GGUF it names, in the repository's models/ folder.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "models" / "default.yaml"


DEFAULT_CORS_METHODS = ("GET", "POST", "OPTIONS")
DEFAULT_RESPONSES_MAX_AGE_S = 30 * 24 * 3600.0  # OpenAI keeps stored responses 30 days
DEFAULT_RESPONSES_MAX_BYTES = 1 << 30
# The Anthropic SDK sends its key and version headers (and, from a browser, an opt-in header).
DEFAULT_CORS_HEADERS = (
    "Authorization",
    "Content-Type",
    "X-Request-Id",
    "X-Api-Key",
    "Anthropic-Version",
    "Anthropic-Beta",
    "Anthropic-Dangerous-Direct-Browser-Access",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """What `raygate serve` runs with, fixed for the process's life; server/cli.py fills it from flags and
    `RAYGATE_*` environment variables."""

    host: str = "127.0.0.1"
    port: int = 8000
    config_path: Path = DEFAULT_CONFIG
    ray_address: str | None = None
    ray_num_cpus: float | None = None
    log_level: str = "info"
    state_dir: Path | None = None
    # The custom Ray resource of the node that holds state_dir (the controller runs there); None: this node.
    state_resource: str | None = None
    ray_namespace: str = "raygate"
    admin_key: str | None = None
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
    # Exposure: listening beyond loopback without an admin key needs this (server/access/exposure.py).
    allow_open_admin: bool = False
    # Without an admin key, refuse /admin (403) instead of serving it open: the image's default.
    closed_admin: bool = False
    # HTTP: the request head's size and time limits, and idle keep-alive (server/transport/http_limits.py).
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    keep_alive_timeout_s: int = 5
    # A client whose socket accepted nothing for this long is dropped and its engine request
    # aborted (server/transport/write_stall.py); 0 never drops.
    stream_stall_timeout_s: float = 60.0
    # Sequences one generating request may start: prompts x `n` (server/serving/base.py).
    max_sequences: int = 64
    # Stored responses (POST /v1/responses): kept this long, and this many bytes at most.
    responses_max_age_s: float = DEFAULT_RESPONSES_MAX_AGE_S
    responses_max_bytes: int = DEFAULT_RESPONSES_MAX_BYTES


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
    the start here, before Ray starts. A config that a persisted registry overrides is not checked:
    it is not used.
    """
    specs = [
        m.model_copy(update={"source": m.source and anchor_source(m.source, settings.config_path.parent)})
        for m in config.models
    ]
    if settings.state_dir is not None:
        _check_state_dir(settings.state_dir)
        if state_file(settings.state_dir).exists():
            return specs
    for spec in specs:
        if spec.source is not None and spec.backend != "synthetic":
            try:
                resolve_model_file(spec.source, folder=spec.backend == "vllm")
            except ModelFileError as exc:
                raise ConfigError(f"model `{spec.name}` in {settings.config_path}: {exc}") from exc
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
