"""``switchyard keys create|list|revoke|rotate``: manage API keys.

Where (``gateway.cli.keys_backends``): with ``--url`` a running gateway's admin API (the
admin key from ``$SWITCHYARD_ADMIN_KEY``, or the variable ``--admin-key-env`` names);
otherwise the policy file's control store (``control:``), or, without one, the legacy keys
file (``auth.keys_file``; no rotation there). Running gateways enforce a change within
about a second.

``create`` and ``rotate`` print the new key once on stdout (and only there: the store keeps
its SHA-256), with the key id on stderr, so ``KEY=$(switchyard keys create --tenant t)``
captures just the key.

``create --rpm/--tpm/--concurrency/--usd-per-day/--usd-per-month`` gives the key limits of
its own, replacing its tenant's ``key_limits`` (a control store or ``--url`` only). There is
no ``update`` command: change a key's limits with ``PATCH /admin/keys/{id}``.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec

from core.config import ConfigError, load_config
from gateway.cli.common import CONFIG_HELP, config_path
from gateway.cli.keys_backends import ApiKeys, CliError, FileKeys, KeysBackend, StoreKeys, View
from policies.control import CreateKey
from policies.control.requests import DEFAULT_GRACE_S

ADMIN_KEY_ENV = "SWITCHYARD_ADMIN_KEY"
# flag -> Limits field, type; any of them given: the key gets limits of its own
LIMIT_FLAGS: dict[str, tuple[str, type]] = {
    "--rpm": ("rpm", int),
    "--tpm": ("tpm", int),
    "--concurrency": ("concurrency", int),
    "--usd-per-day": ("usd_per_day", float),
    "--usd-per-month": ("usd_per_month", float),
}


def _where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help=CONFIG_HELP)
    parser.add_argument("--url", help="a running gateway (its admin API), e.g. http://gw:8080")
    parser.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        help=f"with --url: the variable holding the admin key (default {ADMIN_KEY_ENV})",
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``keys`` with its subcommands to ``subparsers`` (what
    ``ArgumentParser.add_subparsers()`` returns); return the ``keys`` parser."""
    keys: argparse.ArgumentParser = subparsers.add_parser(
        "keys", help="create, list, revoke and rotate API keys"
    )
    commands = keys.add_subparsers(dest="keys_command", required=True)
    create = commands.add_parser("create", help="create a key for a tenant (printed once)")
    create.add_argument("--tenant", required=True, help="a tenant (policy file or API)")
    create.add_argument("--name", default="default", help="a label, e.g. who holds the key")
    create.add_argument("--models", help="comma-separated aliases this key may use (default all)")
    create.add_argument("--expires-at", help="RFC 3339 time (2026-01-31T00:00:00Z) or Unix secs")
    create.add_argument(
        "--meta", action="append", default=[], metavar="KEY=VALUE", help="a tag for usage rows"
    )
    for flag, (field, kind) in LIMIT_FLAGS.items():
        create.add_argument(
            flag, dest=f"limit_{field}", type=kind, help=f"the key's own {field} limit"
        )
    _where(create)
    revoke = commands.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    _where(revoke)
    rotate = commands.add_parser("rotate", help="give a key a new secret (printed once)")
    rotate.add_argument("key_id")
    rotate.add_argument(
        "--grace-seconds",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"how long the old secret keeps working (default {DEFAULT_GRACE_S:.0f})",
    )
    _where(rotate)
    listing = commands.add_parser("list", help="list keys (ids and labels, never secrets)")
    listing.add_argument("--tenant", help="only this tenant's keys")
    _where(listing)
    return keys


def _fail(message: str) -> int:
    print(f"switchyard keys: {message}", file=sys.stderr)
    return 1


def _backend(args: argparse.Namespace) -> KeysBackend:
    """Where this command acts; ``ConfigError``/``CliError`` when that is not set up."""
    if args.url:
        admin_key = os.environ.get(args.admin_key_env, "")
        if not admin_key:
            raise CliError(f"--url needs the admin key in ${args.admin_key_env}")
        return ApiKeys(args.url, admin_key)
    path = config_path(args.config)
    try:
        config = load_config(path)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {error}" for error in exc.errors]) from exc
    if config.control is not None:
        return StoreKeys(config, os.environ)
    if not config.auth.keys_file:
        raise ConfigError(
            [f"{path}: auth.keys_file is not set (nor control:); add one to manage API keys"]
        )
    return FileKeys(config, config.auth.keys_file)


def _iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _create_request(args: argparse.Namespace) -> CreateKey:
    metadata = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--meta takes KEY=VALUE, not '{item}'")
        metadata[key] = value
    raw: dict[str, Any] = {"tenant": args.tenant, "name": args.name, "metadata": metadata}
    if args.models:
        raw["allowed_models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.expires_at:
        expires = args.expires_at
        raw["expires_at"] = float(expires) if expires.replace(".", "", 1).isdigit() else expires
    limits = {
        field: getattr(args, f"limit_{field}")
        for field, _ in LIMIT_FLAGS.values()
        if getattr(args, f"limit_{field}", None) is not None
    }
    if limits:
        raw["limits"] = limits
    try:
        return msgspec.convert(raw, CreateKey)
    except msgspec.ValidationError as exc:
        raise CliError(str(exc)) from exc


def _print_new(secret: str, view: View, what: str) -> None:
    print(secret)
    print(
        f"{what} key {view['id']} for tenant {view['tenant']} ({view['name']}); "
        "this is the only time it is shown",
        file=sys.stderr,
    )


def _list(views: list[View], with_expiry: bool) -> None:
    header = ["KEY_ID", "TENANT", "NAME", "CREATED", "REVOKED"] + (["EXPIRES"] * with_expiry)
    rows = [header]
    for v in views:
        cells = [v["id"], v["tenant"], v["name"], _iso(v["created"]), _iso(v["revoked_at"])]
        rows.append(cells + ([_iso(v["expires_at"])] * with_expiry))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        padded = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(padded).rstrip())


def _dispatch(args: argparse.Namespace, backend: KeysBackend) -> int:
    command = args.keys_command
    if command == "create":
        _print_new(*backend.create(_create_request(args)), "created")
    elif command == "rotate":
        secret, view = backend.rotate(args.key_id, args.grace_seconds)
        _print_new(secret, view, "rotated")
        until = view.get("previous_valid_until")
        print(f"the old secret works until {_iso(until)}", file=sys.stderr)
    elif command == "revoke":
        view = backend.revoke(args.key_id)
        print(f"revoked key {view['id']} (tenant {view['tenant']}) at {_iso(view['revoked_at'])}")
    else:
        _list(backend.list(args.tenant), with_expiry=not isinstance(backend, FileKeys))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``keys`` subcommand; 0 on success, 1 with a message on stderr."""
    try:
        return _dispatch(args, _backend(args))
    except ConfigError as exc:
        return _fail("\n  ".join(exc.errors))
    except CliError as exc:
        return _fail(str(exc))
