"""Process settings for `raygate serve`: where to listen, which models, which Ray cluster, and how
the gateway is operated (keys, limits, timeouts, shutdown), and where the registry is persisted.
Each field is declared once with `setting()`: its default, environment variable and help text; the
`raygate serve` flags are generated from them (server/options.py, server/cli.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from raygate.server.options import Group, setting

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

OPERATIONS = Group("operations", "access, limits, timeouts and shutdown (docs/operations.md)")
STORED_RESPONSES = Group(
    "stored responses",
    "POST /v1/responses with store: true keeps responses in SQLite under --state-dir (in memory "
    "without one), shared by the gateways of a Ray namespace (docs/api/responses.md)",
)
USAGE = Group(
    "usage and budgets",
    "per-key token usage, API keys with budgets and the audit log, in SQLite under --state-dir "
    "(in memory without one) or PostgreSQL, shared by the gateways of a Ray namespace "
    "(docs/usage-and-budgets.md)",
)
BATCHES = Group(
    "files and batches",
    "the Files and Batch APIs keep uploads, batches and their results in SQLite under --state-dir "
    "(in memory without one), shared by the gateways of a Ray namespace (docs/api/batches.md)",
)
IMAGES = Group(
    "images",
    "what a vision model's requests may point the gateway at: image URLs are fetched only from "
    "the hosts listed here (docs/vision.md)",
)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What `raygate serve` runs with, fixed for the process's life. Each field has one flag and one
    environment variable (`setting()`); the flag wins over the variable, the variable over the default."""

    config_path: Path = setting(
        DEFAULT_CONFIG, env="RAYGATE_CONFIG", flag="--config", help="models YAML file"
    )
    host: str = setting("127.0.0.1", env="RAYGATE_HOST", help="address to listen on")
    port: int = setting(8000, env="RAYGATE_PORT", help="port to listen on")
    ray_address: str | None = setting(
        None,
        env="RAY_ADDRESS",
        help="attach to this Ray cluster instead of starting an embedded one, e.g. 10.0.0.5:6379",
    )
    ray_num_cpus: float | None = setting(
        None,
        env="RAYGATE_RAY_NUM_CPUS",
        help="CPUs the embedded Ray may schedule",
        shown_default="all cores",
    )
    ray_dashboard: bool = setting(
        False,
        env="RAYGATE_RAY_DASHBOARD",
        help="the embedded Ray runs all of its own processes (needs ray[default]): its dashboard (port "
        "8265), autoscaler monitor, log monitor and the raylet's agents; without it they are stopped "
        "once Ray is up or stood in for (~430 MB that Raygate never uses)",
    )
    ray_agents: bool = setting(
        False,
        env="RAYGATE_RAY_AGENTS",
        help="the embedded raylet runs Ray's own dashboard and runtime-env agents (~190 MB: Ray's "
        "metrics export with ray[default]) instead of Raygate's stand-ins; implied by --ray-dashboard",
    )
    state_dir: Path | None = setting(
        None,
        env="RAYGATE_STATE_DIR",
        help="persist the model registry here and restore it on start; the config only seeds a new registry",
        shown_default="not persisted",
    )
    # The controller runs on the node that holds state_dir; None: this node.
    state_resource: str | None = setting(
        None,
        env="RAYGATE_STATE_RESOURCE",
        help="run the controller and the Responses store on the Ray node offering this custom "
        "resource (`ray start --resources`), whose disk holds --state-dir, instead of on this "
        "gateway's node: they then outlive a restart of the gateway",
    )
    admin_key: str | None = setting(
        None,
        env="RAYGATE_ADMIN_KEY",
        help="require this bearer token on /admin, at least 8 characters",
        shown_default="/admin is open, which only a loopback --host allows without --allow-open-admin",
    )
    thinking_signing_key: str | None = setting(
        None,
        env="RAYGATE_THINKING_SIGNING_KEY",
        help="key of the signatures on /v1/messages `thinking` blocks (HMAC-SHA256), checked when a "
        "client sends a block back; gateways behind one address need the same key",
        shown_default="a random key per gateway process",
        group=OPERATIONS,
    )
    # Read into admin_key when that is not set (resolve_settings, below).
    admin_key_file: Path | None = setting(
        None,
        env="RAYGATE_ADMIN_KEY_FILE",
        help="read the admin key from this file, e.g. a Docker secret in /run/secrets; surrounding "
        "whitespace is ignored",
    )
    # Without an admin key, refuse /admin (403) instead of serving it open: the image's default.
    closed_admin: bool = setting(
        False,
        env="RAYGATE_CLOSED_ADMIN",
        help="without an admin key, answer /admin with 403 instead of serving it open; allows any "
        "--host; the container image sets it",
    )
    # Exposure: listening beyond loopback without an admin key needs this (server/access/exposure.py).
    allow_open_admin: bool = setting(
        False,
        env="RAYGATE_ALLOW_OPEN_ADMIN",
        help="listen beyond loopback with no admin key: anyone who can connect may deploy and remove models",
        shown_default="refuse to start that way",
    )
    ray_namespace: str = setting(
        "raygate",
        env="RAYGATE_RAY_NAMESPACE",
        help="Ray namespace of the controller and replicas; gateways in one namespace share them",
    )
    log_level: str = setting("info", env="RAYGATE_LOG_LEVEL", help="log level", choices=LOG_LEVELS)
    log_format: str = setting(
        "text",
        env="RAYGATE_LOG_FORMAT",
        help="text, or one JSON object per line; both carry the request id",
        choices=("text", "json"),
        group=OPERATIONS,
    )
    # Access: bearer keys (none = open), a YAML keys file, CORS.
    api_keys: tuple[str, ...] = setting(
        (),
        env="RAYGATE_API_KEYS",
        flag="--api-key",
        help="require `Authorization: Bearer KEY` on /v1/*; repeat for several keys. Prefer the "
        "environment variable or --api-keys-file: a command line is visible in `ps`",
        group=OPERATIONS,
    )
    api_keys_file: Path | None = setting(
        None,
        env="RAYGATE_API_KEYS_FILE",
        help="YAML file of keys with optional per-key models and requests_per_minute",
        group=OPERATIONS,
    )
    cors_origins: tuple[str, ...] = setting(
        (),
        env="RAYGATE_CORS_ORIGINS",
        flag="--cors-origin",
        help="allow browser calls from this origin; repeat, or `*`",
        shown_default="CORS off",
        group=OPERATIONS,
    )
    cors_methods: tuple[str, ...] = setting(
        DEFAULT_CORS_METHODS,
        env="RAYGATE_CORS_METHODS",
        flag="--cors-method",
        help="CORS allowed method; repeat",
        group=OPERATIONS,
    )
    cors_headers: tuple[str, ...] = setting(
        DEFAULT_CORS_HEADERS,
        env="RAYGATE_CORS_HEADERS",
        flag="--cors-header",
        help="CORS allowed request header; repeat",
        group=OPERATIONS,
    )
    # Limits and timeouts (a model's `limits:` block overrides the timeouts).
    max_body_bytes: int = setting(
        8 * 1024 * 1024,
        env="RAYGATE_MAX_BODY_BYTES",
        help="larger request bodies get 413",
        group=OPERATIONS,
    )
    # HTTP: the request head's size and time limits, and idle keep-alive (server/transport/http_limits.py).
    max_header_bytes: int = setting(
        64 * 1024,
        env="RAYGATE_MAX_HEADER_BYTES",
        help="a larger request line + headers gets 431 and the connection is closed",
        group=OPERATIONS,
    )
    header_timeout_s: float = setting(
        10.0,
        env="RAYGATE_HEADER_TIMEOUT",
        flag="--header-timeout",
        help="seconds a client has to send a request's headers, from connecting (on a kept-alive "
        "connection: from the first byte of the next request); then 408, or a plain close if it sent "
        "nothing",
        group=OPERATIONS,
    )
    # Well above the 5 s after which httpx / the openai SDK stop reusing an idle connection: with
    # equal timeouts the server closed connections just as clients sent a POST on them, which they
    # saw as a bare ReadError and do not retry (nginx keeps 75 s for the same reason).
    keep_alive_timeout_s: int = setting(
        75,
        env="RAYGATE_KEEP_ALIVE_TIMEOUT",
        flag="--keep-alive-timeout",
        help="seconds an idle kept-alive connection stays open between requests; keep it above your "
        "clients' (and any proxy's) idle expiry, or a request sent as it closes is lost",
        group=OPERATIONS,
    )
    # server/transport/write_stall.py
    stream_stall_timeout_s: float = setting(
        60.0,
        env="RAYGATE_STREAM_STALL_TIMEOUT",
        flag="--stream-stall-timeout",
        help="seconds a client may read nothing while its response waits to be written (the socket "
        "buffer is full); then the connection is dropped and its engine request aborted; 0 never drops",
        group=OPERATIONS,
    )
    # server/serving/base.py
    max_sequences: int = setting(
        64,
        env="RAYGATE_MAX_SEQUENCES",
        help="most sequences one request may ask for (prompts x n); more get 400",
        group=OPERATIONS,
    )
    ttft_timeout_s: float | None = setting(
        None,
        env="RAYGATE_TTFT_TIMEOUT",
        flag="--ttft-timeout",
        help="seconds from arrival to the first token, queueing included; on expiry the engine request "
        "is aborted and the client gets 504; a model's limits.ttft_timeout_s overrides it",
        shown_default="none",
        group=OPERATIONS,
    )
    request_timeout_s: float | None = setting(
        None,
        env="RAYGATE_REQUEST_TIMEOUT",
        flag="--request-timeout",
        help="seconds from arrival to the end of a response; on expiry the engine request is aborted "
        "and the client gets 504, or an error event + [DONE] mid-stream; a model's "
        "limits.request_timeout_s overrides it",
        shown_default="none",
        group=OPERATIONS,
    )
    sse_ping_s: float = setting(
        15.0,
        env="RAYGATE_SSE_PING_SECONDS",
        flag="--sse-ping-seconds",
        help="send an SSE `: ping` comment every this many seconds while a stream is open; 0 disables",
        group=OPERATIONS,
    )
    drain_timeout_s: float = setting(
        30.0,
        env="RAYGATE_DRAIN_TIMEOUT",
        flag="--drain-timeout",
        help="on SIGTERM, seconds in-flight requests get to finish before they are ended with an error",
        group=OPERATIONS,
    )
    responses_max_age_s: float = setting(
        DEFAULT_RESPONSES_MAX_AGE_S,
        env="RAYGATE_RESPONSES_MAX_AGE",
        flag="--responses-max-age",
        help="seconds a stored response is kept",
        shown_default="30 days",
        group=STORED_RESPONSES,
    )
    responses_max_bytes: int = setting(
        DEFAULT_RESPONSES_MAX_BYTES,
        env="RAYGATE_RESPONSES_MAX_BYTES",
        help="the oldest stored responses are deleted past this many bytes",
        group=STORED_RESPONSES,
    )

    # server/serving/images.py: http(s) image URLs, fetched only from these hosts.
    image_fetch_domains: tuple[str, ...] = setting(
        (),
        env="RAYGATE_IMAGE_FETCH_DOMAINS",
        flag="--image-fetch-domain",
        help="fetch http(s) image URLs from this host (`*.example.com`: its subdomains too); repeat. "
        "A host must resolve to a public address, unless the address itself is listed",
        shown_default="none: image URLs are refused, data: URLs work",
        group=IMAGES,
    )
    image_fetch_timeout_s: float = setting(
        10.0,
        env="RAYGATE_IMAGE_FETCH_TIMEOUT",
        flag="--image-fetch-timeout",
        help="seconds one image fetch may take, redirects included (its size is the model's "
        "`vision.max_image_bytes`)",
        group=IMAGES,
    )
    # backends/cluster/stores/ledger.py: where usage, database keys and the audit log live.
    database_url: str | None = setting(
        None,
        env="RAYGATE_DATABASE_URL",
        help="keep usage, API keys and the audit log in this database, e.g. "
        "postgresql://user:pass@host/raygate; the first gateway of a namespace decides",
        shown_default="SQLite in --state-dir (memory without one)",
        group=USAGE,
    )
    # server/observability/tracing.py: OpenTelemetry spans over OTLP (docs/tracing.md).
    otlp_traces_endpoint: str | None = setting(
        None,
        env="RAYGATE_OTLP_TRACES_ENDPOINT",
        flag="--otlp-traces-endpoint",
        help="export OpenTelemetry traces of every request to this OTLP endpoint (as vLLM's flag: "
        "gRPC, e.g. http://localhost:4317, unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf; "
        "the other OTEL_EXPORTER_OTLP_* and OTEL_SERVICE_NAME variables apply)",
        shown_default="off",
        group=OPERATIONS,
    )
    # server/observability/usage_metrics.py: bounded label cardinality for per-key counters.
    usage_metrics_keys: int = setting(
        20,
        env="RAYGATE_USAGE_METRICS_KEYS",
        help="per-key token counters in /metrics name at most this many keys (the first seen); "
        "the rest count as key `other`",
        group=USAGE,
    )
    files_max_bytes: int = setting(
        200 * 1024 * 1024,
        env="RAYGATE_FILES_MAX_BYTES",
        help="largest file POST /v1/files accepts (OpenAI's batch input limit); larger gets 413",
        group=BATCHES,
    )
    files_quota_bytes: int = setting(
        1 << 30,
        env="RAYGATE_FILES_QUOTA_BYTES",
        help="bytes of files one API key may keep (its uploads and its batches' results); an "
        "upload past it gets 400 quota_exceeded",
        group=BATCHES,
    )
    batch_max_running: int = setting(
        8,
        env="RAYGATE_BATCH_MAX_RUNNING",
        help="batch lines this gateway runs at once (all models); 0 runs none here. Lines also "
        "wait while interactive requests wait for the same model, and take only the engine slots "
        "interactive traffic leaves free",
        group=BATCHES,
    )
    batch_lease_s: float = setting(
        30.0,
        env="RAYGATE_BATCH_LEASE",
        flag="--batch-lease",
        help="seconds a gateway's claim on a batch line lasts unless renewed: after a gateway "
        "dies, its lines run elsewhere (or after its restart) this long later",
        group=BATCHES,
    )
    batch_window_s: float = setting(
        24 * 3600.0,
        env="RAYGATE_BATCH_WINDOW",
        flag="--batch-window",
        help="seconds a batch (completion_window 24h) may run; then it expires, keeping what finished",
        shown_default="24 h",
        group=BATCHES,
    )


class ConfigError(ValueError):
    """The models config cannot be read or does not validate."""


def resolve_settings(settings: Settings) -> Settings:
    """The settings as `raygate serve` runs with them: paths made absolute (from the working
    directory), and the admin key read from `admin_key_file` unless `admin_key` is set."""
    return dataclasses.replace(
        settings,
        config_path=settings.config_path.resolve(),
        state_dir=settings.state_dir and settings.state_dir.resolve(),
        admin_key=settings.admin_key or _read_key_file(settings.admin_key_file),
    )


def _read_key_file(path: Path | None) -> str | None:
    """The admin key kept in a file (a Docker secret), so it is in neither `ps` nor the environment."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise ConfigError(f"cannot read the admin key file {path}: {exc.strerror}") from None
