"""`raygate` command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raygate.client.commands import add_client_commands, run_client
from raygate.server.options import add_options, from_namespace
from raygate.server.settings import ConfigError, Settings, resolve_settings

if TYPE_CHECKING:
    import uvicorn


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The whole `raygate` command line. `serve`'s options are generated from the fields of
    Settings, their defaults read from `environ` (the process environment unless given)."""
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
    add_options(serve, Settings, os.environ if environ is None else environ)
    add_client_commands(sub)
    return parser


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    """How the gateway's HTTP server runs: our head / write-stall limits over uvicorn's protocol,
    and its timeouts from the settings."""
    import uvicorn

    from raygate.server.transport.http_limits import limited_protocol
    from raygate.server.transport.lifecycle import STOP_GRACE_S

    return uvicorn.Config(
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


def _serve(args: argparse.Namespace) -> int:
    from raygate.server.access.exposure import check_exposure
    from raygate.server.app import build_app
    from raygate.server.observability.logs import configure_logging
    from raygate.server.transport.lifecycle import DrainingServer

    try:
        settings = resolve_settings(from_namespace(Settings, args))
    except ConfigError as exc:
        print(f"raygate: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
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
    config = uvicorn_config(app, settings)
    DrainingServer(config, app.state.lifecycle).run()
    return 0


def _exit_after_shutdown(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())
