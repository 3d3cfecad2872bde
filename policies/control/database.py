"""The seam between the control store's SQL and its two databases (SQLite, PostgreSQL),
and the versioned schema both share.

SQL is written once, with ``?`` placeholders and types both databases read the same way
(``TEXT``, ``BIGINT``, ``DOUBLE PRECISION``); a backend translates what differs: the
placeholder style, the auto-numbered key of the audit table, and how writers are kept from
migrating at the same time.

Every change runs in a write transaction whose first statement bumps the one-row
``control_version`` counter: that row's lock (PostgreSQL) or ``BEGIN IMMEDIATE`` (SQLite)
puts writers in line, and replicas that poll the counter see that something changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol


class Tx(Protocol):
    """One open transaction."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one query; its rows."""
        ...


class Database(Protocol):
    """A connection to one control database. Every method may raise
    ``ControlUnavailableError`` (unreachable, timed out, failed mid-transaction: nothing
    was changed)."""

    name: str  # "sqlite" or "postgres"
    auto_id: str  # column definition of an auto-numbered primary key
    migration_lock: str | None  # statement that keeps other processes from migrating too

    def transaction(self, *, write: bool) -> AbstractAsyncContextManager[Tx]:
        """A transaction, committed when the block ends and rolled back when it raises."""
        ...

    async def aclose(self) -> None: ...


TIME = "DOUBLE PRECISION"

# (version, statements); ``{auto_id}`` is the backend's auto-numbered key. Never edit a
# released step: add the next one.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            "CREATE TABLE IF NOT EXISTS control_version "
            "(id INTEGER PRIMARY KEY, version BIGINT NOT NULL)",
            "INSERT INTO control_version (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
            "CREATE TABLE IF NOT EXISTS control_keys ("
            "key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, "
            f"sha256 TEXT NOT NULL, created {TIME} NOT NULL, updated {TIME} NOT NULL, "
            f"expires_at {TIME}, revoked_at {TIME}, previous_sha256 TEXT, "
            f"previous_valid_until {TIME}, allowed_models TEXT, metadata TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS control_keys_tenant ON control_keys (tenant, created)",
            "CREATE TABLE IF NOT EXISTS control_tenants (name TEXT PRIMARY KEY, "
            f"config TEXT NOT NULL, created {TIME} NOT NULL, updated {TIME} NOT NULL)",
            "CREATE TABLE IF NOT EXISTS control_audit (id {auto_id}, "
            f"at {TIME} NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL, "
            "target TEXT NOT NULL, details TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS control_audit_target ON control_audit (target, id)",
        ],
    ),
    # A key's own limits (JSON); NULL: its tenant's key_limits apply. Older replicas name
    # their columns, so they read and write keys as before and leave this one alone.
    (2, ["ALTER TABLE control_keys ADD COLUMN limits TEXT"]),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


class SchemaTooNewError(Exception):
    """The database was migrated by a newer Switchyard than this one."""


async def migrate(db: Database, now: float) -> list[int]:
    """Apply the steps the database lacks, each recorded in ``control_migrations``, all in
    one transaction (so two processes starting at once cannot both apply one); idempotent.
    Returns the versions applied. ``SchemaTooNewError`` when the database is ahead."""
    async with db.transaction(write=True) as tx:
        if db.migration_lock:
            await tx.fetchall(db.migration_lock)
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS control_migrations "
            f"(version INTEGER PRIMARY KEY, applied_at {TIME} NOT NULL)"
        )
        done = {row[0] for row in await tx.fetchall("SELECT version FROM control_migrations")}
        if done and max(done) > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"the control store's schema is at version {max(done)}; this gateway knows "
                f"up to {SCHEMA_VERSION}: upgrade it"
            )
        applied = []
        for version, statements in MIGRATIONS:
            if version in done:
                continue
            for statement in statements:
                await tx.execute(statement.replace("{auto_id}", db.auto_id))
            await tx.execute(
                "INSERT INTO control_migrations (version, applied_at) VALUES (?, ?)",
                (version, now),
            )
            applied.append(version)
    return applied
