"""The usage ledger on PostgreSQL: one table shared by every gateway replica.

Appends (group commit): ``append`` queues the row and awaits the commit that holds it. One
flusher task per ledger takes what is queued (up to ``batch_rows`` rows) and commits it
with a single ``INSERT ... ON CONFLICT (request_id) DO NOTHING`` (one statement in
autocommit: one round trip, one WAL flush for the whole batch). Rows that arrive while a
commit is in flight share the next one (with ``max_wait_s`` > 0 the first row after a
quiet spell also waits that long for company). So the per-row cost on the request path is
a future and a list append, and the database sees few, larger transactions. A row
already there (same ``request_id``) is skipped: retried and replayed appends never count
twice, the first row written wins. Durability is the server's: ``append`` returns after
COMMIT, which with ``synchronous_commit`` on (Postgres' default; a connection that finds
it ``off`` turns it on for itself) means the WAL is flushed.

Outages: the writer holds one connection, opened on the first append (with the schema
migrations, ``postgres_schema.migrate``) and reopened after a failure. A commit or connect
that fails for a reachability reason, or takes longer than ``timeout_s``, fails every row
of its batch with ``PostgresUnavailableError`` (a ``StoreUnavailableError``), and for
``retry_interval_s`` on the injected clock every append and read fails fast the same way,
without network I/O; then the next one tries again. ``SpoolingLedger`` catches these and
keeps the rows in its local spool until they can be replayed (``append_many``). A commit
whose acknowledgement was lost may have landed: its replay is then a no-op. Any other
error (a bug, not an outage) fails its batch; the rows are then retried one per
transaction, so one bad row cannot take its neighbours down with it.

Reads: each ``rows()`` iteration opens its own connection (exports are rare and long, and a
fresh connection recovers at once after a restart of Postgres) and pages with keyset
pagination on ``(ts, request_id)``, ``page_rows`` rows per query. Order is exact: by
``ts``, then ``request_id``. A ledger that is only read never writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from core.clock import Clock
from core.tenancy import UsageRow
from policies.ledger.base import PAGE_ROWS
from policies.ledger.postgres_schema import (
    ID_INDEX,
    INSERT,
    TS_INDEX,
    decode,
    insert_payload,
    migrate,
    page_query,
)
from policies.pg import Connection, PostgresUnavailableError, connect, unreachable

_Item = tuple[UsageRow, "asyncio.Future[None]"]
READ_TIMEOUT_S = 60.0  # one page query of an export; an indexed range scan, normally ms
_DURABLE = (
    "SELECT set_config('synchronous_commit', 'on', false)"
    " WHERE current_setting('synchronous_commit') = 'off'"
)


class PostgresLedger:
    """``Ledger`` on the Postgres database at ``dsn`` (see the module docstring)."""

    def __init__(
        self,
        dsn: str,
        clock: Clock,
        *,
        batch_rows: int = 500,
        max_wait_s: float = 0.0,
        timeout_s: float = 2.0,
        retry_interval_s: float = 1.0,
        page_rows: int = PAGE_ROWS,
    ) -> None:
        self.clock = clock
        self.batch_rows = batch_rows
        self.max_wait_s = max_wait_s
        self.timeout_s = timeout_s
        self.retry_interval_s = retry_interval_s
        self.page_rows = page_rows
        self.commits = 0  # INSERT transactions committed (fewer than rows: group commit)
        self.failures = 0  # batches or reads failed because Postgres was unreachable
        self._dsn = dsn
        self._pending: list[_Item] = []
        self._wake = asyncio.Event()  # rows are queued (or the ledger is closing)
        self._full = asyncio.Event()  # a whole batch is queued: stop lingering
        self._flusher: asyncio.Task[None] | None = None
        self._conn: Connection | None = None  # the writer's
        self._schema_ready = False
        self._schema_lock = asyncio.Lock()
        self._opening = asyncio.Lock()  # one writer connection, however many ask for it
        self._down_until: float | None = None
        self._closed = False

    @property
    def available(self) -> bool:
        """False while failing fast after an outage."""
        return self._down_until is None or self.clock.now() >= self._down_until

    async def prepare(self) -> None:
        """Connect and bring the schema up to date now (else the first append does).
        Raises ``PostgresUnavailableError`` when Postgres cannot be reached."""
        await self._writer()

    async def append(self, row: UsageRow) -> None:
        """Return once the COMMIT holding ``row`` (or an earlier row with its request_id)
        has returned. Raises ``PostgresUnavailableError`` when Postgres is unreachable
        (the row may or may not have landed) and the database's error for anything else."""
        await self._enqueue(row)

    async def append_many(self, rows: Sequence[UsageRow]) -> None:
        """``append`` for many rows at once (in as few transactions as ``batch_rows``
        allows); raises the first failure once every row has an outcome."""
        outcomes = await asyncio.gather(
            *(self._enqueue(row) for row in rows), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def _enqueue(self, row: UsageRow) -> asyncio.Future[None]:
        if self._closed:
            raise RuntimeError("the ledger is closed")
        if not self.available:
            raise PostgresUnavailableError("postgres unavailable (retrying later)")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((row, future))
        if len(self._pending) >= self.batch_rows:
            self._full.set()
        self._wake.set()
        if self._flusher is None or self._flusher.done():  # done: only if it crashed (a bug)
            self._flusher = asyncio.create_task(self._flush_loop(), name="ledger-pg-flush")
        return future

    async def _flush_loop(self) -> None:
        """Wait for rows, linger briefly at the start of a burst, then commit batches
        until the queue is empty. Ends when the ledger is closed and nothing is queued."""
        while True:
            if not self._pending:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.max_wait_s > 0 and len(self._pending) < self.batch_rows and not self._closed:
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.max_wait_s):
                        await self._full.wait()
            while self._pending:
                batch = self._pending[: self.batch_rows]
                del self._pending[: self.batch_rows]
                await self._commit(batch)

    async def _commit(self, batch: list[_Item]) -> None:
        """Commit ``batch`` and resolve each row's future with the outcome."""
        error = await self._insert([row for row, _ in batch])
        if error is not None and len(batch) > 1 and not isinstance(error, PostgresUnavailableError):
            for item in batch:  # a bad row: find it, commit the others
                await self._commit([item])
            return
        for _, future in batch:
            if not future.done():  # its appender was cancelled: the outcome stands anyway
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    async def _insert(self, rows: list[UsageRow]) -> BaseException | None:
        """One INSERT of ``rows``; None when committed, else the error (outages as
        ``PostgresUnavailableError``, which also starts the fail-fast period)."""
        if not self.available:
            return PostgresUnavailableError("postgres unavailable (retrying later)")
        try:
            async with unreachable("ledger commit"):
                conn = await self._writer()
                async with asyncio.timeout(self.timeout_s):
                    await conn.execute(INSERT, (insert_payload(rows),))
        except PostgresUnavailableError as exc:
            await self._down()
            return exc
        except Exception as exc:
            return exc
        self.commits += 1
        self._down_until = None
        return None

    async def _writer(self) -> Connection:
        """The writer's connection, opened (and the schema migrated) if need be; ``prepare``
        and the flusher may ask at once, and get the same one."""
        async with self._opening:
            if self._conn is None or self._conn.closed:
                self._conn = await self._open_writer()
            return self._conn

    async def _open_writer(self) -> Connection:
        conn = await connect(self._dsn, timeout_s=self.timeout_s, application_name="ledger")
        try:
            async with unreachable("ledger open"), asyncio.timeout(self.timeout_s):
                await conn.execute(_DURABLE)
                await self._ensure_schema(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _ensure_schema(self, conn: Connection) -> None:
        async with self._schema_lock:
            if not self._schema_ready:
                await migrate(conn)
                self._schema_ready = True

    async def _down(self) -> None:
        """Start the fail-fast period and drop the writer's connection (its state is
        unknown after a failure or a timeout mid-statement)."""
        self.failures += 1
        self._down_until = self.clock.now() + self.retry_interval_s
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def rows(
        self, *, tenant: str | None = None, start: float | None = None, end: float | None = None
    ) -> AsyncIterator[UsageRow]:
        """Matching rows ordered by (ts, request_id), ``page_rows`` per query, on a
        connection of this iteration's own. ``PostgresUnavailableError`` when Postgres
        cannot be reached (before the first row, or mid-way)."""
        if not self.available:
            raise PostgresUnavailableError("postgres unavailable (retrying later)")
        try:
            conn = await connect(self._dsn, timeout_s=self.timeout_s, application_name="ledger")
        except PostgresUnavailableError:
            await self._down()
            raise
        try:
            after: tuple[float, str] | None = None
            while True:
                query, args = page_query(tenant, start, end, after, self.page_rows)
                page = await self._page(conn, query, args)
                for values in page:
                    yield decode(values)
                if len(page) < self.page_rows:
                    return
                last = page[-1]
                after = (last[TS_INDEX], last[ID_INDEX])
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _page(self, conn: Connection, query: str, args: list[Any]) -> list[tuple[Any, ...]]:
        try:
            async with unreachable("ledger read"), asyncio.timeout(READ_TIMEOUT_S):
                await self._ensure_schema(conn)
                cursor = await conn.execute(query, args)
                return await cursor.fetchall()
        except PostgresUnavailableError:
            await self._down()
            raise

    async def aclose(self) -> None:
        """Commit what is queued (or fail it, if Postgres is unreachable), then close the
        writer's connection. Idempotent."""
        self._closed = True
        self._full.set()
        self._wake.set()
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            await flusher
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
