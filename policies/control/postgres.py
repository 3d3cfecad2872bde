"""The control store on PostgreSQL: the fleet backend, psycopg 3 async, connections from
the shared helpers in ``policies.pg``.

One connection per process (the control plane is a few admin writes and one tiny poll
every ~250 ms per replica), one transaction at a time on it. A connection that fails is
dropped and the next call opens a new one, so a database restart costs a replica one
failed poll. An unreachable server is ``ControlUnavailableError`` (503); other database
errors are bugs and propagate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from policies.control.errors import ControlUnavailableError
from policies.pg import Connection, PostgresUnavailableError, connect, is_unreachable

# Any constant: the key of the advisory lock that lets one process migrate at a time.
_MIGRATION_LOCK_KEY = 0x5357_4354  # "SWCT"


def _pg(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (the control SQL has no other ``?``/``%``)."""
    return sql.replace("?", "%s")


def _idle(conn: Connection) -> bool:
    return conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


class _PgTx:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cursor = await self._conn.execute(_pg(sql), params)
        return cursor.rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cursor = await self._conn.execute(_pg(sql), params)
        return await cursor.fetchall()


class PostgresDatabase:
    """``Database`` on the PostgreSQL server at ``dsn``; ``timeout_s`` bounds connecting."""

    name = "postgres"
    auto_id = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    migration_lock: str | None = f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_KEY})"

    def __init__(self, dsn: str, *, timeout_s: float = 5.0) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = await connect(
                    self._dsn, timeout_s=self._timeout_s, application_name="switchyard-control"
                )
            except PostgresUnavailableError as exc:
                raise ControlUnavailableError(f"control store: {exc}") from exc
        return self._conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[_PgTx]:
        async with self._lock:
            try:
                conn = await self._connection()
                async with conn.transaction():
                    yield _PgTx(conn)
            except (psycopg.Error, OSError) as exc:
                await self._drop()  # its state is unknown: start clean next time
                if is_unreachable(exc):
                    raise ControlUnavailableError(f"control store: {exc}") from exc
                raise
            except BaseException:
                # a cancelled caller may leave the connection mid-statement: start clean
                if self._conn is not None and not _idle(self._conn):
                    await asyncio.shield(self._drop())
                raise

    async def aclose(self) -> None:
        await self._drop()
