"""`raygate` command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from raygate.client.commands import add_client_commands, run_client
from raygate.server.settings import (
    DEFAULT_CONFIG,
    DEFAULT_CORS_HEADERS,
    DEFAULT_CORS_METHODS,
    DEFAULT_RESPONSES_MAX_AGE_S,
    DEFAULT_RESPONSES_MAX_BYTES,
    ConfigError,
    Settings,
)


def _env_list(name: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


def _env_float(name: str, default: float | None) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else default


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raygate",
        description="OpenAI-compatible gateway that serves LLMs on Ray.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="start the gateway and the models of a config file",
        description="Start the HTTP gateway and one Ray replica set per configured model.",
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("RAYGATE_CONFIG", DEFAULT_CONFIG)),
        help="models YAML file (env RAYGATE_CONFIG; default: %(default)s)",
    )
    serve.add_argument(
        "--host",
        default=os.environ.get("RAYGATE_HOST", "127.0.0.1"),
        help="address to listen on (env RAYGATE_HOST; default: %(default)s)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("RAYGATE_PORT", "8000")),
        help="port to listen on (env RAYGATE_PORT; default: %(default)s)",
    )
    serve.add_argument(
        "--ray-address",
        default=os.environ.get("RAY_ADDRESS") or None,
        help="attach to this Ray cluster instead of starting an embedded one "
        "(env RAY_ADDRESS; e.g. 10.0.0.5:6379)",
    )
    serve.add_argument(
        "--ray-num-cpus",
        type=float,
        default=float(os.environ["RAYGATE_RAY_NUM_CPUS"]) if os.environ.get("RAYGATE_RAY_NUM_CPUS") else None,
        help="CPUs the embedded Ray may schedule (env RAYGATE_RAY_NUM_CPUS; default: all cores)",
    )
    serve.add_argument(
        "--state-dir",
        type=Path,
        default=_env_path("RAYGATE_STATE_DIR"),
        help="persist the model registry here and restore it on start; the config only seeds a new "
        "registry (env RAYGATE_STATE_DIR; default: not persisted)",
    )
    serve.add_argument(
        "--state-resource",
        default=os.environ.get("RAYGATE_STATE_RESOURCE") or None,
        help="run the controller and the Responses store on the Ray node offering this custom "
        "resource (`ray start --resources`), whose disk holds --state-dir, instead of on this "
        "gateway's node: they then outlive a restart of the gateway (env RAYGATE_STATE_RESOURCE)",
    )
    serve.add_argument(
        "--admin-key",
        default=os.environ.get("RAYGATE_ADMIN_KEY") or None,
        help="require this bearer token on /admin, at least 8 characters (env RAYGATE_ADMIN_KEY; "
        "default: /admin is open, which only a loopback --host allows without --allow-open-admin)",
    )
    serve.add_argument(
        "--admin-key-file",
        type=Path,
        default=_env_path("RAYGATE_ADMIN_KEY_FILE"),
        help="read the admin key from this file, e.g. a Docker secret in /run/secrets (env "
        "RAYGATE_ADMIN_KEY_FILE); surrounding whitespace is ignored",
    )
    serve.add_argument(
        "--closed-admin",
        action="store_true",
        default=_env_flag("RAYGATE_CLOSED_ADMIN"),
        help="without an admin key, answer /admin with 403 instead of serving it open; allows any "
        "--host (env RAYGATE_CLOSED_ADMIN=1, the container image's default)",
    )
    serve.add_argument(
        "--allow-open-admin",
        action="store_true",
        default=_env_flag("RAYGATE_ALLOW_OPEN_ADMIN"),
        help="listen beyond loopback with no admin key: anyone who can connect may deploy and remove "
        "models (env RAYGATE_ALLOW_OPEN_ADMIN=1; default: refuse to start that way)",
    )
    serve.add_argument(
        "--ray-namespace",
        default=os.environ.get("RAYGATE_RAY_NAMESPACE", "raygate"),
        help="Ray namespace of the controller and replicas; gateways in one namespace share them "
        "(env RAYGATE_RAY_NAMESPACE; default: %(default)s)",
    )
    serve.add_argument(
        "--log-level",
        default=os.environ.get("RAYGATE_LOG_LEVEL", "info"),
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level (env RAYGATE_LOG_LEVEL; default: %(default)s)",
    )
    add_client_commands(sub)
    _add_operations_options(serve)
    _add_responses_options(serve)
    return parser


def _add_responses_options(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group(
        "stored responses",
        "POST /v1/responses with store: true keeps responses in SQLite under --state-dir (in memory "
        "without one), shared by the gateways of a Ray namespace (README: Responses API)",
    )
    group.add_argument(
        "--responses-max-age",
        type=float,
        default=_env_float("RAYGATE_RESPONSES_MAX_AGE", DEFAULT_RESPONSES_MAX_AGE_S),
        help="seconds a stored response is kept (env RAYGATE_RESPONSES_MAX_AGE; default: 30 days)",
    )
    group.add_argument(
        "--responses-max-bytes",
        type=int,
        default=int(os.environ.get("RAYGATE_RESPONSES_MAX_BYTES", str(DEFAULT_RESPONSES_MAX_BYTES))),
        help="the oldest stored responses are deleted past this many bytes (env "
        "RAYGATE_RESPONSES_MAX_BYTES; default: %(default)s)",
    )


def _add_operations_options(serve: argparse.ArgumentParser) -> None:
    ops = serve.add_argument_group("operations", "access, limits, timeouts and shutdown (README: Operations)")
    ops.add_argument(
        "--log-format",
        default=os.environ.get("RAYGATE_LOG_FORMAT", "text"),
        choices=["text", "json"],
        help="text, or one JSON object per line; both carry the request id (env RAYGATE_LOG_FORMAT)",
    )
    ops.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require `Authorization: Bearer KEY` on /v1/*; repeat for several keys. Prefer the env "
        "RAYGATE_API_KEYS (comma-separated) or --api-keys-file: a command line is visible in `ps`",
    )
    ops.add_argument(
        "--api-keys-file",
        type=Path,
        default=_env_path("RAYGATE_API_KEYS_FILE"),
        help="YAML file of keys with optional per-key models and requests_per_minute "
        "(env RAYGATE_API_KEYS_FILE)",
    )
    ops.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        help="allow browser calls from this origin; repeat, or `*` (env RAYGATE_CORS_ORIGINS, "
        "comma-separated; default: CORS off)",
    )
    ops.add_argument(
        "--cors-method",
        action="append",
        default=None,
        help="CORS allowed method; repeat (env RAYGATE_CORS_METHODS; default: GET, POST, OPTIONS)",
    )
    ops.add_argument(
        "--cors-header",
        action="append",
        default=None,
        help="CORS allowed request header; repeat (env RAYGATE_CORS_HEADERS; default: Authorization, "
        "Content-Type, X-Request-Id)",
    )
    ops.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(os.environ.get("RAYGATE_MAX_BODY_BYTES", str(8 * 1024 * 1024))),
        help="larger request bodies get 413 (env RAYGATE_MAX_BODY_BYTES; default: %(default)s)",
    )
    ops.add_argument(
        "--max-header-bytes",
        type=int,
        default=int(os.environ.get("RAYGATE_MAX_HEADER_BYTES", str(64 * 1024))),
        help="a larger request line + headers gets 431 and the connection is closed "
        "(env RAYGATE_MAX_HEADER_BYTES; default: %(default)s)",
    )
    ops.add_argument(
        "--header-timeout",
        type=float,
        default=_env_float("RAYGATE_HEADER_TIMEOUT", 10.0),
        help="seconds a client has to send a request's headers, from connecting (or from the end of "
        "its previous request); then 408, or a plain close if it sent nothing (env "
        "RAYGATE_HEADER_TIMEOUT; default: %(default)s)",
    )
    ops.add_argument(
        "--keep-alive-timeout",
        type=int,
        default=int(os.environ.get("RAYGATE_KEEP_ALIVE_TIMEOUT", "5")),
        help="seconds an idle kept-alive connection stays open between requests "
        "(env RAYGATE_KEEP_ALIVE_TIMEOUT; default: %(default)s)",
    )
    ops.add_argument(
        "--stream-stall-timeout",
        type=float,
        default=_env_float("RAYGATE_STREAM_STALL_TIMEOUT", 60.0),
        help="seconds a client may read nothing while its response waits to be written (the "
        "socket buffer is full); then the connection is dropped and its engine request aborted; "
        "0 never drops (env RAYGATE_STREAM_STALL_TIMEOUT; default: %(default)s)",
    )
    ops.add_argument(
        "--max-sequences",
        type=int,
        default=int(os.environ.get("RAYGATE_MAX_SEQUENCES", "64")),
        help="most sequences one request may ask for (prompts x n); more get 400 "
        "(env RAYGATE_MAX_SEQUENCES; default: %(default)s)",
    )
    ops.add_argument(
        "--ttft-timeout",
        type=float,
        default=_env_float("RAYGATE_TTFT_TIMEOUT", None),
        help="seconds from arrival to the first token, queueing included; on expiry the engine request "
        "is aborted and the client gets 504 (env RAYGATE_TTFT_TIMEOUT; default: none; a model's "
        "limits.ttft_timeout_s overrides it)",
    )
    ops.add_argument(
        "--request-timeout",
        type=float,
        default=_env_float("RAYGATE_REQUEST_TIMEOUT", None),
        help="seconds from arrival to the end of a response; on expiry the engine request is aborted "
        "and the client gets 504, or an error event + [DONE] mid-stream (env RAYGATE_REQUEST_TIMEOUT; "
        "default: none; a model's limits.request_timeout_s overrides it)",
    )
    ops.add_argument(
        "--sse-ping-seconds",
        type=float,
        default=_env_float("RAYGATE_SSE_PING_SECONDS", 15.0),
        help="send an SSE `: ping` comment every this many seconds while a stream is open; 0 disables "
        "(env RAYGATE_SSE_PING_SECONDS; default: %(default)s)",
    )
    ops.add_argument(
        "--drain-timeout",
        type=float,
        default=_env_float("RAYGATE_DRAIN_TIMEOUT", 30.0),
        help="on SIGTERM, seconds in-flight requests get to finish before they are ended with an "
        "error (env RAYGATE_DRAIN_TIMEOUT; default: %(default)s)",
    )


def _read_key_file(path: Path | None) -> str | None:
    """The admin key kept in a file (a Docker secret), so it is in neither `ps` nor the environment."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise ConfigError(f"cannot read the admin key file {path}: {exc.strerror}") from None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from raygate.server.access.exposure import check_exposure
    from raygate.server.app import build_app
    from raygate.server.observability.logs import configure_logging
    from raygate.server.transport.http_limits import limited_protocol
    from raygate.server.transport.lifecycle import STOP_GRACE_S, DrainingServer

    try:
        admin_key = args.admin_key or _read_key_file(args.admin_key_file)
    except ConfigError as exc:
        print(f"raygate: {exc}", file=sys.stderr)
        return 2
    settings = Settings(
        host=args.host,
        port=args.port,
        config_path=args.config.resolve(),
        ray_address=args.ray_address,
        ray_num_cpus=args.ray_num_cpus,
        log_level=args.log_level,
        state_dir=args.state_dir.resolve() if args.state_dir else None,
        state_resource=args.state_resource,
        ray_namespace=args.ray_namespace,
        admin_key=admin_key,
        log_format=args.log_format,
        api_keys=tuple(args.api_key or _env_list("RAYGATE_API_KEYS")),
        api_keys_file=args.api_keys_file,
        cors_origins=tuple(args.cors_origin or _env_list("RAYGATE_CORS_ORIGINS")),
        cors_methods=tuple(args.cors_method or _env_list("RAYGATE_CORS_METHODS") or DEFAULT_CORS_METHODS),
        cors_headers=tuple(args.cors_header or _env_list("RAYGATE_CORS_HEADERS") or DEFAULT_CORS_HEADERS),
        max_body_bytes=args.max_body_bytes,
        ttft_timeout_s=args.ttft_timeout,
        request_timeout_s=args.request_timeout,
        sse_ping_s=args.sse_ping_seconds,
        drain_timeout_s=args.drain_timeout,
        allow_open_admin=args.allow_open_admin,
        closed_admin=args.closed_admin,
        max_header_bytes=args.max_header_bytes,
        header_timeout_s=args.header_timeout,
        keep_alive_timeout_s=args.keep_alive_timeout,
        stream_stall_timeout_s=args.stream_stall_timeout,
        max_sequences=args.max_sequences,
        responses_max_age_s=args.responses_max_age,
        responses_max_bytes=args.responses_max_bytes,
    )
    configure_logging(args.log_level, args.log_format)
    try:
        for warning in check_exposure(settings, bool(settings.api_keys or settings.api_keys_file)):
            logging.getLogger("raygate.server.access.exposure").warning("%s", warning)
        app = build_app(settings)
    except ConfigError as exc:
        print(f"raygate: {exc}", file=sys.stderr)
        return 2
    # uvicorn shuts down on SIGTERM/SIGINT (after our drain, server/transport/lifecycle.py), then re-raises
    # the signal against the handlers it found: make that a clean exit, since the shutdown has
    # already completed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_after_shutdown)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's records go through our handler (request id, JSON)
        access_log=False,  # server/transport/middleware.py writes the access log, with the request id
        timeout_graceful_shutdown=int(STOP_GRACE_S) + 5,
        http=limited_protocol(
            settings.max_header_bytes, settings.header_timeout_s, settings.stream_stall_timeout_s
        ),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=settings.keep_alive_timeout_s,
    )
    DrainingServer(config, app.state.lifecycle).run()
    return 0


def _exit_after_shutdown(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())
