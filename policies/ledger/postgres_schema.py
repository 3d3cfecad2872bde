"""The Postgres ledger's schema: versioned migrations and the SQL of appends and reads.

Migrations are ordered steps (``Migration``: a version, a name, SQL statements), recorded in
``schema_migrations (component, version, name, applied_at)`` — ``component`` lets other
parts keep their own versions in the same table (the ledger's is ``ledger``). ``migrate``
applies the missing steps in one transaction under a transaction-scoped advisory lock, so
replicas that start together wait for each other: the first applies, the others find
nothing to do. A step never changes once released; a change to the table is a new step.
A database migrated by a newer release (versions this one does not know) is left as it is:
steps only add, so older code keeps working during a rolling upgrade.

The table ``usage_ledger`` has one column per ``UsageRow`` field (``request_id`` the primary
key, collated ``"C"`` so the order matches Python's and the SQLite ledger's), plus
``committed_at`` (when the row reached Postgres: a replayed row is late by the outage), and
indexes on ``(ts, request_id)`` and ``(tenant, ts, request_id)`` for keyset-paged reads.

Appends: one ``INSERT ... SELECT FROM json_populate_recordset(NULL::usage_ledger, $1)
ON CONFLICT (request_id) DO NOTHING`` for a whole batch, the rows sent as one JSON array
(msgspec encodes it in C: a few microseconds of the gateway's CPU per row, where adapting
one Python list per column cost several times that). The statement is constant (prepared
once per connection) whatever the batch size. A column the table lacks fails the INSERT
loudly (``tests`` check that the migrations cover every ``UsageRow`` field).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from core.tenancy import UsageRow
from policies.ledger.base import COLUMNS, keyset_page_query
from policies.pg import Connection

COMPONENT = "ledger"
TABLE = "usage_ledger"
# Any constant (b"SYLEDGER" as an integer): the advisory lock key of schema migrations.
MIGRATION_LOCK = 0x53594C4544474552


class Migration(msgspec.Struct, frozen=True):
    """One schema step: applied once, in ``version`` order, all ``statements`` together."""

    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "usage_ledger table",
        (
            f"""CREATE TABLE {TABLE} (
                request_id text COLLATE "C" PRIMARY KEY,
                ts double precision NOT NULL,
                tenant text COLLATE "C",
                key_id text,
                model text,
                provider text,
                upstream_model text,
                endpoint text NOT NULL DEFAULT 'chat',
                stream boolean NOT NULL DEFAULT false,
                status integer NOT NULL DEFAULT 200,
                error text,
                prompt_tokens bigint NOT NULL DEFAULT 0,
                completion_tokens bigint NOT NULL DEFAULT 0,
                cached_tokens bigint NOT NULL DEFAULT 0,
                cost_usd double precision NOT NULL DEFAULT 0,
                ttft_ms double precision,
                latency_ms double precision NOT NULL DEFAULT 0,
                queue_ms double precision NOT NULL DEFAULT 0,
                attempts integer NOT NULL DEFAULT 0,
                fallbacks integer NOT NULL DEFAULT 0,
                cache_hit boolean NOT NULL DEFAULT false,
                client_request_id text,
                usage_estimated boolean NOT NULL DEFAULT false,
                committed_at timestamptz NOT NULL DEFAULT now()
            )""",
            f"CREATE INDEX {TABLE}_ts ON {TABLE} (ts, request_id)",
            f"CREATE INDEX {TABLE}_tenant_ts ON {TABLE} (tenant, ts, request_id)",
        ),
    ),
    Migration(2, "usage_ledger.tags", (f"ALTER TABLE {TABLE} ADD COLUMN tags text",)),
)

CREATE_MIGRATIONS = """CREATE TABLE IF NOT EXISTS schema_migrations (
    component text NOT NULL,
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version)
)"""


def check_order(migrations: Sequence[Migration]) -> None:
    """``ValueError`` unless the versions are 1, 2, 3... in order (a gap or a repeat is a
    release mistake, found before anything touches the database)."""
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..n in order, got {versions}")


async def migrate(
    conn: Connection, migrations: Sequence[Migration] = MIGRATIONS, component: str = COMPONENT
) -> list[int]:
    """Apply the steps of ``component`` that the database lacks, in one transaction under
    the advisory lock; returns the versions applied (empty when it was up to date).
    Errors propagate (wrap in ``policies.pg.unreachable`` to map outages); a failed step
    leaves the database as it was."""
    check_order(migrations)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(CREATE_MIGRATIONS)
        cursor = await conn.execute(
            "SELECT version FROM schema_migrations WHERE component = %s", (component,)
        )
        done = {int(version) for (version,) in await cursor.fetchall()}
        applied: list[int] = []
        for step in migrations:
            if step.version in done:
                continue
            for statement in step.statements:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO schema_migrations (component, version, name) VALUES (%s, %s, %s)",
                (component, step.version, step.name),
            )
            applied.append(step.version)
        return applied


# ---------------------------------------------------------------- appends and reads


_ENCODER = msgspec.json.Encoder()
_COLUMN_LIST = ", ".join(COLUMNS)

INSERT = (
    f"INSERT INTO {TABLE} ({_COLUMN_LIST}) "
    f"SELECT {_COLUMN_LIST} FROM json_populate_recordset(NULL::{TABLE}, %s::json) "
    "ON CONFLICT (request_id) DO NOTHING"
)


def insert_payload(rows: Sequence[UsageRow]) -> str:
    """The INSERT's one parameter: the rows as a JSON array of objects (msgspec encodes
    it in C; Postgres maps the keys to the columns by name, and parses floats exactly)."""
    payload = _ENCODER.encode(rows)
    if b"\\u0000" in payload:
        # Postgres text cannot hold NUL; an upstream error message might. One bad character
        # must not make a row impossible to commit (and stick in the spool forever).
        payload = _ENCODER.encode([_without_nul(row) for row in rows])
    return payload.decode()


def _without_nul(row: UsageRow) -> UsageRow:
    changes = {
        name: value.replace("\x00", "\ufffd")
        for name in COLUMNS
        if isinstance(value := getattr(row, name), str) and "\x00" in value
    }
    return msgspec.structs.replace(row, **changes) if changes else row


def page_query(
    tenant: str | None,
    start: float | None,
    end: float | None,
    after: tuple[float, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """One page's SELECT on this backend's table (``base.keyset_page_query``)."""
    return keyset_page_query(TABLE, "%s", tenant, start, end, after, limit)


TS_INDEX = COLUMNS.index("ts")
ID_INDEX = COLUMNS.index("request_id")


def decode(values: Sequence[Any]) -> UsageRow:
    """A row read back (the columns in ``COLUMNS`` order)."""
    return UsageRow(**dict(zip(COLUMNS, values, strict=True)))
