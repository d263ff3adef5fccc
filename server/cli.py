"""`raygate` command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from server.client_cli import add_client_commands, run_client
from server.settings import DEFAULT_CONFIG, ConfigError, Settings


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
        default=Path(os.environ["RAYGATE_STATE_DIR"]) if os.environ.get("RAYGATE_STATE_DIR") else None,
        help="persist the model registry here and restore it on start; the config only seeds a new "
        "registry (env RAYGATE_STATE_DIR; default: not persisted)",
    )
    serve.add_argument(
        "--admin-key",
        default=os.environ.get("RAYGATE_ADMIN_KEY") or None,
        help="require this bearer token on /admin (env RAYGATE_ADMIN_KEY; default: /admin is open)",
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
    return parser


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import build_app

    settings = Settings(
        host=args.host,
        port=args.port,
        config_path=args.config.resolve(),
        ray_address=args.ray_address,
        ray_num_cpus=args.ray_num_cpus,
        log_level=args.log_level,
        state_dir=args.state_dir.resolve() if args.state_dir else None,
        ray_namespace=args.ray_namespace,
        admin_key=args.admin_key,
    )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = build_app(settings)
    except ConfigError as exc:
        print(f"raygate: {exc}", file=sys.stderr)
        return 2
    # uvicorn drains and shuts down on SIGTERM/SIGINT, then re-raises the signal against the
    # handlers it found: make that a clean exit, since the shutdown has already completed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_after_shutdown)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)
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
