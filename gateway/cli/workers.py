"""``switchyard workers status --url URL``: the worker processes a running gateway manages
(its ``workers:`` section), one line per process, from ``GET /admin/targets``.

The admin key comes from ``$SWITCHYARD_ADMIN_KEY`` (or the variable ``--admin-key-env``
names), or ``--admin-key`` (visible to other users in the process list: prefer the
variable). Exit status 0 when every worker is ready, 2 when some are not, 1 on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx

ADMIN_KEY_ENV = "SWITCHYARD_ADMIN_KEY"
NOT_READY = 2
# (header, how a row's cell is written)
_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("WORKER", lambda w: f"{w['name']}/{w['replica']}"),
    ("STATE", lambda w: str(w["state"]) + (" (outgoing)" if w.get("outgoing") else "")),
    ("PID", lambda w: _text(w.get("pid"))),
    ("PORT", lambda w: _text(w.get("port"))),
    ("DEVICES", lambda w: ",".join(w.get("devices") or []) or "-"),
    ("RESTARTS", lambda w: _text(w.get("restarts"))),
    ("LAST_EXIT", lambda w: _text(w.get("last_exit_code"))),
    ("WAITING", lambda w: _text(w.get("waiting"))),
    ("RUNNING", lambda w: _text(w.get("running"))),
    ("KV_USE", lambda w: _percent(w.get("kv_usage"))),
    ("PROVIDER", lambda w: str(w["provider"])),
]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``workers`` (with ``status``) to ``subparsers``; return the ``workers`` parser."""
    workers: argparse.ArgumentParser = subparsers.add_parser(
        "workers", help="the worker processes a gateway runs (workers: section)"
    )
    commands = workers.add_subparsers(dest="workers_command", required=True)
    status = commands.add_parser("status", help="each worker process: state, pid, load")
    status.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8080")
    status.add_argument("--admin-key", help="the admin key (default: from --admin-key-env)")
    status.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        help=f"the variable holding the admin key (default {ADMIN_KEY_ENV})",
    )
    status.add_argument("--json", action="store_true", help="print the rows as JSON")
    return workers


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _percent(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{100 * value:.0f}%"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as aligned text lines, a header first."""
    cells = [[header for header, _ in _COLUMNS]]
    cells += [[cell(row) for _, cell in _COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]


def fetch(url: str, admin_key: str) -> list[dict[str, Any]]:
    """The ``workers`` list of ``GET {url}/admin/targets``; ``RuntimeError`` otherwise."""
    try:
        response = httpx.get(
            url.rstrip("/") + "/admin/targets",
            headers={"authorization": f"Bearer {admin_key}"},
            timeout=10.0,
        )
    except httpx.HTTPError as exc:
        raise RuntimeError(f"cannot reach {url}: {exc}") from exc
    if response.status_code != 200:
        raise RuntimeError(f"{url}/admin/targets answered {response.status_code}: {response.text}")
    workers: list[dict[str, Any]] = response.json().get("workers", [])
    return workers


def run(args: argparse.Namespace) -> int:
    """Print the status table; see the module's docstring for the exit status."""
    admin_key = args.admin_key or os.environ.get(args.admin_key_env, "")
    if not admin_key:
        print(f"switchyard workers: give --admin-key or set ${args.admin_key_env}", file=sys.stderr)
        return 1
    try:
        rows = fetch(args.url, admin_key)
    except RuntimeError as exc:
        print(f"switchyard workers: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no workers (the gateway's policy has no workers: section)")
    else:
        print("\n".join(table(rows)))
    current = [row for row in rows if not row.get("outgoing")]
    return 0 if all(row["state"] == "ready" for row in current) else NOT_READY
