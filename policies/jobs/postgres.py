"""The job store on PostgreSQL (``PostgresJobs``): the fleet's backend, the same four tables
as the SQLite file (``schema``), so the store's SQL runs unchanged on either.

Connections are psycopg 3's synchronous ones, in autocommit (transactions are explicit,
``db.PostgresDb.write``), run by the store's one worker thread like the SQLite connection:
the store's functions stay synchronous and shared by both backends. Each opened connection
asks for durable commits (``synchronous_commit`` on, unless the server already has a
stronger setting) and TCP keepalives, so a server that vanished is noticed in seconds.

Schema: versioned steps (``MIGRATIONS``) recorded in ``schema_migrations`` under the
component ``jobs``, applied by ``migrate`` in one transaction under the same advisory lock
as the ledger's migrations (``policies.ledger.postgres_schema``): replicas that start
together wait for each other, and the two components never race to create that table. A
step never changes once released; a change to a table is a new step.

Types: Unix times in ``double precision`` or ``bigint`` (SQLite's ``REAL`` is a 4-byte
float in Postgres, too coarse for a lease), counters in ``bigint``, bytes in ``bytea``
(at most 1 GB per value: far above ``batch.max_file_bytes``' 200 MB default), keys as
identity columns. The tables have plain names (``files``, ``batches``, ``items``,
``webhook_deliveries``): give the job store its own database, or its own schema through
the DSN (``options=-csearch_path=switchyard_jobs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from policies.jobs.db import PostgresDb
from policies.ledger.postgres_schema import (
    CREATE_MIGRATIONS,
    MIGRATION_LOCK,
    Migration,
    check_order,
)
from policies.pg import is_unreachable

COMPONENT = "jobs"
APPLICATION_NAME = "switchyard-jobs"
_LIBPQ_MIN_CONNECT_S = 2  # libpq waits at least this long, whatever connect_timeout says
_DURABLE = (
    "SELECT set_config('synchronous_commit', 'on', false)"
    " WHERE current_setting('synchronous_commit') = 'off'"
)
# libpq keepalives, unless the DSN sets its own: a server that vanished without closing
# the connection (a dead host) is noticed in about 10 + 3 * 5 s, not the kernel's 2 hours.
_KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
_SEQ = "seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "files, batches, items, webhook_deliveries",
        (
            f"""CREATE TABLE files (
                {_SEQ},
                id TEXT NOT NULL UNIQUE,
                tenant TEXT NOT NULL,
                filename TEXT NOT NULL,
                purpose TEXT NOT NULL,
                bytes BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT,
                content BYTEA NOT NULL)""",
            f"""CREATE TABLE batches (
                {_SEQ},
                id TEXT NOT NULL UNIQUE,
                tenant TEXT NOT NULL,
                key_id TEXT,
                via TEXT NOT NULL,
                endpoint TEXT NOT NULL,
                input_file_id TEXT NOT NULL,
                completion_window TEXT NOT NULL,
                status TEXT NOT NULL,
                closing TEXT,
                errors BYTEA,
                metadata BYTEA,
                output_file_id TEXT,
                error_file_id TEXT,
                output_expires_s BIGINT,
                created_at BIGINT NOT NULL,
                in_progress_at BIGINT,
                expires_at BIGINT NOT NULL,
                finalizing_at BIGINT,
                completed_at BIGINT,
                failed_at BIGINT,
                expired_at BIGINT,
                cancelling_at BIGINT,
                cancelled_at BIGINT,
                total BIGINT NOT NULL DEFAULT 0,
                completed BIGINT NOT NULL DEFAULT 0,
                failed BIGINT NOT NULL DEFAULT 0,
                delete_at DOUBLE PRECISION,
                model TEXT,
                input_tokens BIGINT NOT NULL DEFAULT 0,
                cached_tokens BIGINT NOT NULL DEFAULT 0,
                output_tokens BIGINT NOT NULL DEFAULT 0,
                reasoning_tokens BIGINT NOT NULL DEFAULT 0)""",
            """CREATE TABLE items (
                batch_id TEXT NOT NULL,
                line INTEGER NOT NULL,
                tenant TEXT NOT NULL,
                custom_id TEXT NOT NULL,
                body BYTEA NOT NULL,
                state TEXT NOT NULL,
                owner TEXT,
                lease_until DOUBLE PRECISION,
                attempts INTEGER NOT NULL DEFAULT 0,
                result BYTEA,
                PRIMARY KEY (batch_id, line))""",
            f"""CREATE TABLE webhook_deliveries (
                {_SEQ},
                id TEXT NOT NULL UNIQUE,
                tenant TEXT NOT NULL,
                endpoint TEXT NOT NULL,
                batch_id TEXT NOT NULL,
                type TEXT NOT NULL,
                payload BYTEA NOT NULL,
                state TEXT NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at DOUBLE PRECISION NOT NULL,
                owner TEXT,
                lease_until DOUBLE PRECISION,
                url TEXT,
                last_status INTEGER,
                last_error TEXT,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                delivered_at DOUBLE PRECISION)""",
            "CREATE INDEX files_tenant ON files (tenant, seq)",
            "CREATE INDEX files_expiry ON files (expires_at)",
            "CREATE INDEX batches_tenant ON batches (tenant, seq)",
            "CREATE INDEX batches_status ON batches (status, seq)",
            "CREATE INDEX items_open ON items (batch_id, line)"
            " WHERE state IN ('pending', 'running')",
            "CREATE INDEX items_owner ON items (owner) WHERE owner IS NOT NULL",
            "CREATE INDEX deliveries_due ON webhook_deliveries (next_attempt_at)"
            " WHERE state = 'pending'",
            "CREATE INDEX deliveries_batch ON webhook_deliveries (batch_id, seq)",
            "CREATE INDEX deliveries_ended ON webhook_deliveries (updated_at)"
            " WHERE state != 'pending'",
        ),
    ),
    Migration(
        2,
        "batches.provider, batches.provider_batch_id (provider batch APIs)",
        (
            "ALTER TABLE batches ADD COLUMN provider TEXT",
            "ALTER TABLE batches ADD COLUMN provider_batch_id TEXT",
        ),
    ),
)


def migrate(
    conn: psycopg.Connection[tuple[Any, ...]],
    migrations: Sequence[Migration] = MIGRATIONS,
    component: str = COMPONENT,
) -> list[int]:
    """Apply the steps of ``component`` the database lacks, in one transaction under the
    advisory lock; the versions applied (empty when it was up to date). A database
    migrated by a newer release keeps the steps this one does not know (steps only add)."""
    check_order(migrations)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(CREATE_MIGRATIONS)
        cursor = conn.execute(
            "SELECT version FROM schema_migrations WHERE component = %s", (component,)
        )
        done = {int(version) for (version,) in cursor.fetchall()}
        applied: list[int] = []
        for step in migrations:
            if step.version in done:
                continue
            for statement in step.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (component, version, name) VALUES (%s, %s, %s)",
                (component, step.version, step.name),
            )
            applied.append(step.version)
        return applied


def _with_keepalives(dsn: str) -> str:
    given = conninfo_to_dict(dsn)
    return make_conninfo(dsn, **{k: v for k, v in _KEEPALIVE.items() if k not in given})


class PostgresJobs:
    """The job store in the Postgres database at ``dsn`` (``db.Backend``); connecting
    takes at most ``timeout_s`` (libpq rounds it up to whole seconds, at least 2)."""

    def __init__(self, dsn: str, *, timeout_s: float = 5.0) -> None:
        self.dsn = dsn
        self.timeout_s = timeout_s
        self._migrated = False

    def open(self) -> PostgresDb:
        conn = psycopg.connect(
            _with_keepalives(self.dsn),
            autocommit=True,
            connect_timeout=max(_LIBPQ_MIN_CONNECT_S, math.ceil(self.timeout_s)),
            application_name=APPLICATION_NAME,
        )
        try:
            conn.execute(_DURABLE)
            if not self._migrated:
                migrate(conn)
                self._migrated = True
        except BaseException:
            conn.close()
            raise
        return PostgresDb(conn)

    def unreachable(self, exc: BaseException) -> str | None:
        # A deadlock or serialization failure (SQLSTATE class 40) is an OperationalError
        # too, but the server is fine: the transaction was rolled back, and the error
        # propagates (the runner tries again at its next turn) without failing fast.
        rolled_back = isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("40")
        if rolled_back or not is_unreachable(exc):
            return None
        return str(exc).strip() or type(exc).__name__
