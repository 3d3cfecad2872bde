"""``switchyard usage export``: write the ledger's rows to a file as CSV or JSON Lines.

    switchyard usage export --tenant T --from 2024-05-01 --to 2024-05-31 \\
        --format csv [--group-by day|model|key] --out may.csv [--config F]

Reads the ledger the policy file names (the SQLite file, or the Redis stream when the state
is in Redis), the same rows and columns as ``GET /admin/usage`` (``docs/usage_export.md``).
The file appears complete or not at all: lines go to a temporary file in the same folder,
which is synced and renamed over ``--out`` at the end (mode 0600: usage is private; ``--out -``
writes to stdout). A row counter runs on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

from core.config import Config, ConfigError, load_config
from core.errors import InvalidRequestError
from core.tenancy import UsageRow
from gateway.cli.common import CONFIG_HELP, config_path
from policies.ledger import Ledger, ledger_backend, open_ledger, sqlite_path
from policies.ledger.export import FORMATS, GROUP_BYS, ExportQuery, export_lines, parse_query
from policies.store.base import StoreUnavailableError

_TIME_HELP = "ISO date or datetime (UTC), or Unix seconds"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``usage`` (with ``export``) to ``subparsers``; return the ``usage`` parser."""
    usage: argparse.ArgumentParser = subparsers.add_parser("usage", help="usage exports")
    commands = usage.add_subparsers(dest="usage_command", required=True)
    export = commands.add_parser("export", help="export ledger rows as CSV or JSON Lines")
    export.add_argument("--tenant", help="only this tenant's rows (default: every tenant)")
    export.add_argument("--from", dest="start", help=f"first time included: {_TIME_HELP}")
    export.add_argument(
        "--to", dest="end", help=f"end (a date includes that whole day): {_TIME_HELP}"
    )
    export.add_argument("--format", dest="fmt", choices=FORMATS, default="jsonl")
    export.add_argument("--group-by", dest="group_by", choices=GROUP_BYS)
    export.add_argument("--out", required=True, help="output file ('-' for stdout)")
    export.add_argument("--config", help=CONFIG_HELP)
    return usage


def _fail(message: str) -> int:
    print(f"switchyard usage: {message}", file=sys.stderr)
    return 1


class _Progress:
    """Rows read so far, redrawn in place on stderr (at most ~10 times a second)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.rows = 0
        self._drawn = 0.0

    async def count(self, rows: AsyncIterator[UsageRow]) -> AsyncIterator[UsageRow]:
        async for row in rows:
            self.rows += 1
            now = time.monotonic()
            if now - self._drawn >= 0.1:
                self._drawn = now
                self.stream.write(f"\rrows read: {self.rows:,}")
                self.stream.flush()
            yield row

    def done(self, lines: int, where: str) -> None:
        self.stream.write(f"\rrows read: {self.rows:,}; wrote {lines:,} lines to {where}\n")
        self.stream.flush()


async def _write(ledger: Ledger, query: ExportQuery, out: IO[bytes], progress: _Progress) -> int:
    rows = ledger.rows(tenant=query.tenant, start=query.start, end=query.end)
    lines = 0
    try:
        async for line in export_lines(progress.count(rows), query.fmt, query.group_by):
            out.write(line)
            lines += 1
    finally:
        await ledger.aclose()
    return lines


def _sqlite_ledger(config: Config) -> Ledger:
    """The SQLite ledger; a missing file is an error, not a new empty ledger."""
    path = sqlite_path(config)
    if not path.exists():
        raise ConfigError([f"ledger.path: no usage ledger at {path}"])
    return open_ledger(config)


async def _to_file(ledger: Ledger, query: ExportQuery, out: str, progress: _Progress) -> int:
    """Write to a temporary file beside ``out``, sync it, then rename it over ``out``."""
    target = Path(out)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            lines = await _write(ledger, query, handle, progress)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return lines


async def _export(config: Config, query: ExportQuery, out: str) -> int:
    store = None
    if ledger_backend(config) == "redis":
        from policies.store.redis import RedisStore

        store = RedisStore(config.state.redis)
    try:
        shared = store is not None or ledger_backend(config) == "postgres"
        ledger = open_ledger(config, store) if shared else _sqlite_ledger(config)
        progress = _Progress(sys.stderr)
        if out == "-":
            lines = await _write(ledger, query, sys.stdout.buffer, progress)
            sys.stdout.buffer.flush()
        else:
            lines = await _to_file(ledger, query, out, progress)
        progress.done(lines, "stdout" if out == "-" else out)
    finally:
        if store is not None:
            await store.aclose()
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``usage export``; 0 on success, 1 with a message on stderr."""
    path = config_path(args.config)
    try:
        config = load_config(path)
        query = parse_query(
            tenant=args.tenant, start=args.start, end=args.end,
            group_by=args.group_by, fmt=args.fmt,
        )  # fmt: skip
        return asyncio.run(_export(config, query, args.out))
    except ConfigError as exc:
        return _fail(f"{path}: " + "\n  ".join(exc.errors))
    except InvalidRequestError as exc:
        option = {"from": "--from", "to": "--to"}.get(exc.param or "", exc.param)
        return _fail(f"{option}: {exc.message}")
    except (StoreUnavailableError, sqlite3.Error, OSError) as exc:
        return _fail(str(exc))
