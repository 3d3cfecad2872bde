"""``switchyard keys create|revoke|list``: manage the API keys in ``auth.keys_file``.

``create`` prints the new key once on stdout (and only there: the file keeps its SHA-256),
with the key id on stderr, so ``KEY=$(switchyard keys create --tenant t)`` captures just the
key. Running gateways pick up a change within about a second (they re-check the file).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import Any

from core.config import Config, ConfigError, load_config, relative_to_config
from gateway.cli.common import CONFIG_HELP, config_path
from policies.auth.keys import KeyRecord, KeysFile, KeysFileError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``keys`` with its three subcommands to ``subparsers`` (what
    ``ArgumentParser.add_subparsers()`` returns); return the ``keys`` parser."""
    keys: argparse.ArgumentParser = subparsers.add_parser(
        "keys", help="create, revoke and list API keys"
    )
    commands = keys.add_subparsers(dest="keys_command", required=True)
    create = commands.add_parser("create", help="create a key for a tenant (printed once)")
    create.add_argument("--tenant", required=True, help="a tenant named in the policy file")
    create.add_argument("--name", default="default", help="a label, e.g. who holds the key")
    create.add_argument("--config", help=CONFIG_HELP)
    revoke = commands.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.add_argument("--config", help=CONFIG_HELP)
    listing = commands.add_parser("list", help="list keys (ids and labels, never secrets)")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.add_argument("--config", help=CONFIG_HELP)
    return keys


def _fail(message: str) -> int:
    print(f"switchyard keys: {message}", file=sys.stderr)
    return 1


def _keys_file(args: argparse.Namespace) -> tuple[Config, KeysFile]:
    """The config and its keys file; ``ConfigError`` when either is missing."""
    path = config_path(args.config)
    try:
        config = load_config(path)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {error}" for error in exc.errors]) from exc
    if not config.auth.keys_file:
        raise ConfigError([f"{path}: auth.keys_file is not set; add it to manage API keys"])
    return config, KeysFile(relative_to_config(config, config.auth.keys_file))


def _iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _create(args: argparse.Namespace, config: Config, keys: KeysFile) -> int:
    if args.tenant not in config.tenants:
        known = ", ".join(sorted(config.tenants)) or "none"
        return _fail(f"unknown tenant '{args.tenant}' (tenants in the config: {known})")
    plaintext, record = keys.create(args.tenant, args.name, now=time.time())
    print(plaintext)
    print(
        f"created key {record.key_id} for tenant {record.tenant} ({record.name}); "
        "this is the only time it is shown",
        file=sys.stderr,
    )
    return 0


def _revoke(args: argparse.Namespace, keys: KeysFile) -> int:
    try:
        record = keys.revoke(args.key_id, now=time.time())
    except KeyError:
        return _fail(f"no key with id '{args.key_id}' in {keys.path}")
    print(f"revoked key {record.key_id} (tenant {record.tenant}) at {_iso(record.revoked_at)}")
    return 0


def _list(args: argparse.Namespace, keys: KeysFile) -> int:
    records: list[KeyRecord] = [
        r for r in keys.list_keys() if args.tenant is None or r.tenant == args.tenant
    ]
    rows = [("KEY_ID", "TENANT", "NAME", "CREATED", "REVOKED")]
    rows += [(r.key_id, r.tenant, r.name, _iso(r.created), _iso(r.revoked_at)) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``keys`` subcommand; 0 on success, 1 with a message on stderr."""
    try:
        config, keys = _keys_file(args)
        if args.keys_command == "create":
            return _create(args, config, keys)
        if args.keys_command == "revoke":
            return _revoke(args, keys)
        return _list(args, keys)
    except ConfigError as exc:
        return _fail("\n  ".join(exc.errors))
    except KeysFileError as exc:
        return _fail(str(exc))
