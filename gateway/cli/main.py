"""``switchyard`` command line: serve, check-config, worker, workers, keys, usage, route,
--version."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from core.config import ConfigError, load_config
from gateway import __version__
from gateway.cli import keys as cli_keys
from gateway.cli import route as cli_route
from gateway.cli import usage as cli_usage
from gateway.cli import workers as cli_workers
from gateway.cli.common import CONFIG_HELP, config_path


def _progress(message: str) -> None:
    print(f"[switchyard] {message}", file=sys.stderr, flush=True)


def _exit_cleanly(signum: int, frame: object) -> None:
    # uvicorn drains on SIGTERM, puts back the handler it found (this one) and raises the
    # signal again: a graceful shutdown then ends with exit code 0, not death by signal.
    raise SystemExit(0)


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.process import server
    from gateway.process.observe import configure_logging

    path = config_path(args.config)
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    configure_logging(config.logging, redact=config.observability.redact)
    _progress(
        f"config {path}: {len(config.models)} model aliases, "
        f"{len(config.providers)} providers; listening on http://{args.host}:{args.port}"
    )
    if config.open_access:
        _progress(
            "no tenants configured: the gateway is open (anyone who can reach it may call "
            "it); add a `tenants:` section to require API keys or JWTs"
        )
    app = create_app(config, progress=_progress)
    signal.signal(signal.SIGTERM, _exit_cleanly)
    # Timeouts and limits on connections (server.header_timeout_s ...): gateway/server.py.
    started = server.run(app, config.server, args.host, args.port)
    return 0 if started else 3  # uvicorn's exit code when it cannot start


def cmd_check_config(args: argparse.Namespace) -> int:
    path = config_path(args.path)
    try:
        config = load_config(path)
    except ConfigError as exc:
        for error in exc.errors:
            print(f"{path}: {error}", file=sys.stderr)
        return 1
    unset = [
        f"{name} (needs ${p.api_key_env})"
        for name, p in config.providers.items()
        if p.api_key_env and not os.environ.get(p.api_key_env)
    ]
    print(f"{path}: OK ({len(config.providers)} providers, {len(config.models)} models)")
    if unset:
        print("providers that will be skipped until their key is set: " + ", ".join(unset))
    return 0


def cmd_worker(args: argparse.Namespace, rest: list[str]) -> int:
    from local_tier.worker import main as worker_main

    return int(worker_main(rest))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description=__doc__)
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help=CONFIG_HELP)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    check = commands.add_parser("check-config", help="validate a policy file")
    check.add_argument("path", nargs="?")
    worker = commands.add_parser(
        "worker", help="run a local-tier worker: `switchyard worker jax --help`", add_help=False
    )
    worker.add_argument("kind", choices=["jax"])
    cli_keys.add_parser(commands)
    cli_usage.add_parser(commands)
    cli_route.add_parser(commands)
    cli_workers.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "worker":
        return cmd_worker(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "serve":
        return cmd_serve(args)
    runners = {"keys": cli_keys.run, "usage": cli_usage.run, "workers": cli_workers.run}
    if args.command in runners:
        return runners[args.command](args)
    if args.command == "route":
        return cli_route.run(args, config_path(args.config))
    return cmd_check_config(args)


if __name__ == "__main__":
    sys.exit(main())
