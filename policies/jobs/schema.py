"""The job store's SQLite file: tables, indexes, connections (``SqliteJobs``, the
single-host backend; ``postgres`` is the fleet's, with the same tables).

Four tables, every row carrying its tenant:

- ``files``: uploads and output/error files, the bytes as a BLOB. ``seq`` orders lists.
- ``batches``: one row per batch: the caller (tenant, key id, how it authenticated), the
  OpenAI fields, the request counters (kept in the same transaction as the items that
  move them), ``closing`` (``cancelled`` or ``expired`` once the batch must stop taking
  work; the visible status follows when the last running item settles) and
  ``delete_at`` (set when the batch ends: retention).
- ``items``: one row per request line: ``state`` pending -> running -> done | failed,
  ``owner`` and ``lease_until`` while running (for a pending item, ``lease_until`` is
  the time before which it may not be claimed: a retry's back-off), ``result`` the
  output or error line. Items are deleted when their batch's files are written.
- ``webhook_deliveries``: the webhook outbox (``outbox``): one row per event to deliver,
  inserted in the transaction that changes the batch's status; ``state`` pending ->
  delivered | failed, ``owner`` and ``lease_until`` while a sender holds it.

Durability as in the ledger: WAL, ``synchronous=FULL`` (a COMMIT is on disk), and every
write in ``BEGIN IMMEDIATE`` (``db.SqliteDb.write``) so a second process waits
(``busy_timeout``) instead of failing mid-transaction.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from policies.jobs.db import SqliteDb

BUSY_TIMEOUT_MS = 10_000
_TABLES = (
    """CREATE TABLE IF NOT EXISTS files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        content BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS batches (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        key_id TEXT,
        via TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        closing TEXT,
        errors BLOB,
        metadata BLOB,
        output_file_id TEXT,
        error_file_id TEXT,
        output_expires_s INTEGER,
        created_at INTEGER NOT NULL,
        in_progress_at INTEGER,
        expires_at INTEGER NOT NULL,
        finalizing_at INTEGER,
        completed_at INTEGER,
        failed_at INTEGER,
        expired_at INTEGER,
        cancelling_at INTEGER,
        cancelled_at INTEGER,
        total INTEGER NOT NULL DEFAULT 0,
        completed INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        delete_at REAL)""",
    """CREATE TABLE IF NOT EXISTS items (
        batch_id TEXT NOT NULL,
        line INTEGER NOT NULL,
        tenant TEXT NOT NULL,
        custom_id TEXT NOT NULL,
        body BLOB NOT NULL,
        state TEXT NOT NULL,
        owner TEXT,
        lease_until REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        result BLOB,
        PRIMARY KEY (batch_id, line))""",
    """CREATE TABLE IF NOT EXISTS webhook_deliveries (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        batch_id TEXT NOT NULL,
        type TEXT NOT NULL,
        payload BLOB NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        owner TEXT,
        lease_until REAL,
        url TEXT,
        last_status INTEGER,
        last_error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        delivered_at REAL)""",
)
# Columns added after the first release: ALTER TABLE adds them to an older file at open.
_ADDED_COLUMNS = (
    ("batches", "model", "TEXT"),
    ("batches", "input_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("batches", "cached_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("batches", "output_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("batches", "reasoning_tokens", "INTEGER NOT NULL DEFAULT 0"),
    # provider batches (``remote``): the provider whose batch API runs it, and its batch id
    ("batches", "provider", "TEXT"),
    ("batches", "provider_batch_id", "TEXT"),
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS files_tenant ON files (tenant, seq)",
    "CREATE INDEX IF NOT EXISTS files_expiry ON files (expires_at)",
    "CREATE INDEX IF NOT EXISTS batches_tenant ON batches (tenant, seq)",
    "CREATE INDEX IF NOT EXISTS batches_status ON batches (status, seq)",
    # what claims scan: the open items of a batch, in line order
    "CREATE INDEX IF NOT EXISTS items_open ON items (batch_id, line)"
    " WHERE state IN ('pending', 'running')",
    "CREATE INDEX IF NOT EXISTS items_owner ON items (owner) WHERE owner IS NOT NULL",
    # what the webhook sender scans: the events still to deliver, soonest first
    "CREATE INDEX IF NOT EXISTS deliveries_due ON webhook_deliveries (next_attempt_at)"
    " WHERE state = 'pending'",
    "CREATE INDEX IF NOT EXISTS deliveries_batch ON webhook_deliveries (batch_id, seq)",
    "CREATE INDEX IF NOT EXISTS deliveries_ended ON webhook_deliveries (updated_at)"
    " WHERE state != 'pending'",
)


class SqliteJobs:
    """The job store in the SQLite file at ``path`` (``db.Backend``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self) -> SqliteDb:
        return connect(self.path)

    def unreachable(self, exc: BaseException) -> str | None:
        return None  # a locked or broken file propagates as it always has


def connect(path: Path) -> SqliteDb:
    """A connection in autocommit mode (transactions are explicit), creating the file,
    its folder and the schema when needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    db = SqliteDb(conn)
    with db.write():
        for statement in _TABLES:
            conn.execute(statement)
        _add_columns(conn)
        for statement in _INDEXES:
            conn.execute(statement)
    return db


def _add_columns(conn: sqlite3.Connection) -> None:
    for table, column, kind in _ADDED_COLUMNS:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
