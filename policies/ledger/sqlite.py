"""The embedded usage ledger: one SQLite file, safe against crashes, shared by nobody.

Durability: WAL journal with ``synchronous=FULL``, so a COMMIT has reached the disk (the WAL
is fsynced) before it returns. ``append`` puts the row on a queue and awaits a future that
the single writer thread resolves after the COMMIT containing the row. The event loop never
waits on fsync, and requests that arrive while a commit is syncing share the next one
(group commit: one fsync for up to ``batch_rows`` rows).

Schema: one table ``usage`` whose columns are ``UsageRow``'s fields (booleans as 0/1),
``request_id`` the PRIMARY KEY (``INSERT OR IGNORE``: a retried append never counts twice;
the first row written wins), and indexes on ``(tenant, ts, request_id)`` and
``(ts, request_id)``. Fields added to ``UsageRow`` later are added as columns on open.

Reads: each ``rows()`` iteration opens its own read connection (WAL readers do not block
the writer) and pages with keyset pagination on ``(ts, request_id)``, ``page_rows`` rows per
query, each query run in a worker thread. Order is exact: by ``ts``, then ``request_id``.

The path must be a file (``:memory:`` cannot be shared by the writer and the readers).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from core.tenancy import UsageRow
from policies.ledger.base import COLUMNS, PAGE_ROWS, keyset_page_query

_INSERT = (
    f"INSERT OR IGNORE INTO usage ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS usage_tenant_ts ON usage (tenant, ts, request_id)",
    "CREATE INDEX IF NOT EXISTS usage_ts ON usage (ts, request_id)",
)
_STOP = object()
_Item = tuple[tuple[Any, ...], "asyncio.Future[None]"]


def _sql_type(kind: msgspec.inspect.Type) -> str:
    """The SQLite column type for one field's msgspec type (``X | None`` -> X's type)."""
    kinds = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
    for each in kinds:
        if isinstance(each, msgspec.inspect.StrType):
            return "TEXT"
        if isinstance(each, msgspec.inspect.FloatType):
            return "REAL"
        if isinstance(each, (msgspec.inspect.IntType, msgspec.inspect.BoolType)):
            return "INTEGER"
    return "BLOB"


def _column_types() -> dict[str, str]:
    info = msgspec.inspect.type_info(UsageRow)
    assert isinstance(info, msgspec.inspect.StructType)
    return {f.name: _sql_type(f.type) for f in info.fields}


def _default_sql(name: str) -> str:
    """`` DEFAULT <literal>`` for a column added to an existing table, so rows written
    before the field existed read back as the field's default."""
    info = msgspec.inspect.type_info(UsageRow)
    assert isinstance(info, msgspec.inspect.StructType)
    default = next(f.default for f in info.fields if f.name == name)
    if default is msgspec.NODEFAULT or default is None:
        return ""
    if isinstance(default, str):
        return " DEFAULT '" + default.replace("'", "''") + "'"
    return f" DEFAULT {int(default) if isinstance(default, bool) else default!r}"


def _column_kinds() -> dict[str, str]:
    """``bool`` for the boolean fields (stored as 0/1, turned back into bools on read)."""
    info = msgspec.inspect.type_info(UsageRow)
    assert isinstance(info, msgspec.inspect.StructType)
    return {
        f.name: "bool" if isinstance(f.type, msgspec.inspect.BoolType) else "other"
        for f in info.fields
    }


def connect(path: Path, *, reader: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with the ledger's
    durability settings. A ``reader`` connection only SELECTs, and may be used from any
    one thread at a time (a ``rows()`` iteration hops between worker threads)."""
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=not reader)
    conn.execute("PRAGMA busy_timeout=5000")  # another process (the CLI) may hold a lock
    if not reader:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    return conn


def create_schema(path: Path) -> None:
    """Create (or upgrade) the table and its indexes; idempotent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    types = _column_types()
    conn = connect(path)
    try:
        columns = ", ".join(
            f"{name} {types[name]}" + (" PRIMARY KEY" if name == "request_id" else "")
            for name in COLUMNS
        )
        conn.execute(f"CREATE TABLE IF NOT EXISTS usage ({columns})")
        have = {row[1] for row in conn.execute("PRAGMA table_info(usage)")}
        for name in COLUMNS:
            if name not in have:
                conn.execute(
                    f"ALTER TABLE usage ADD COLUMN {name} {types[name]}{_default_sql(name)}"
                )
        for statement in _INDEXES:
            conn.execute(statement)
    finally:
        conn.close()


def _params(row: UsageRow) -> tuple[Any, ...]:
    return tuple(getattr(row, name) for name in COLUMNS)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled; the row is committed regardless
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _notify(future: asyncio.Future[None], error: BaseException | None) -> None:
    """Resolve ``future`` on its own loop (called from the writer thread)."""
    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting
        future.get_loop().call_soon_threadsafe(_resolve, future, error)


class _Writer:
    """The one thread that writes: takes everything queued, commits it in one
    transaction, then resolves each row's future with the outcome of that COMMIT."""

    def __init__(self, path: Path, batch_rows: int) -> None:
        self._path = path
        self._batch_rows = batch_rows
        self.commits = 0  # transactions committed (fewer than rows: group commit)
        self.queue: queue.SimpleQueue[_Item | object] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            conn = connect(self._path)
        except sqlite3.Error as exc:
            self._fail_all(exc)
            return
        try:
            stop = False
            while not stop:
                batch, stop = self._take()
                if batch:
                    self._commit(conn, batch)
        finally:
            conn.close()

    def _take(self) -> tuple[list[_Item], bool]:
        """Block for one item, then drain what else is queued (up to ``batch_rows``)."""
        first = self.queue.get()
        if first is _STOP:
            return [], True
        batch: list[_Item] = [first]  # type: ignore[list-item]
        while len(batch) < self._batch_rows:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)  # type: ignore[arg-type]
        return batch, False

    def _commit(self, conn: sqlite3.Connection, batch: Sequence[_Item]) -> None:
        error: BaseException | None = None
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT, [params for params, _ in batch])
            conn.execute("COMMIT")
            self.commits += 1
        except Exception as exc:  # any failure fails this batch, never the thread
            error = exc
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        for _, future in batch:
            _notify(future, error)

    def _fail_all(self, error: BaseException) -> None:
        while True:
            item = self.queue.get()
            if item is _STOP:
                return
            _notify(item[1], error)  # type: ignore[index]


class SqliteLedger:
    """``Ledger`` on a SQLite file (see the module docstring). The schema is created when
    the ledger is constructed (so a bad path fails at startup); the writer thread starts
    on the first append, so a ledger that is only read never writes."""

    def __init__(
        self, path: str | Path, *, page_rows: int = PAGE_ROWS, batch_rows: int = 1000
    ) -> None:
        self.path = Path(path)
        self.page_rows = page_rows
        self._batch_rows = batch_rows
        self._writer: _Writer | None = None
        self._commits_before = 0  # commits of writers already stopped
        self._closed = False
        create_schema(self.path)

    async def append(self, row: UsageRow) -> None:
        """Return after the COMMIT that holds ``row`` (or a row with its request_id) has
        been synced. Raises ``sqlite3.Error`` when that commit failed."""
        if self._closed:
            raise RuntimeError("the ledger is closed")
        if self._writer is None:
            self._writer = _Writer(self.path, self._batch_rows)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writer.queue.put((_params(row), future))
        await future

    async def rows(
        self, *, tenant: str | None = None, start: float | None = None, end: float | None = None
    ) -> AsyncIterator[UsageRow]:
        """Matching rows ordered by (ts, request_id), ``page_rows`` per query."""
        reader = Reader(await asyncio.to_thread(connect, self.path, reader=True))
        try:
            after: tuple[float, str] | None = None
            while True:
                query, args = page_query(tenant, start, end, after, self.page_rows)
                page = await reader.fetch(query, args)
                for values in page:
                    yield _decode(values)
                if len(page) < self.page_rows:
                    return
                last = page[-1]
                after = (last[_TS], last[_ID])
        finally:
            reader.close()

    async def oldest(self, limit: int) -> list[UsageRow]:
        """The ``limit`` oldest rows, ordered by (ts, request_id), read in one query."""
        reader = Reader(await asyncio.to_thread(connect, self.path, reader=True))
        try:
            page = await reader.fetch(*page_query(None, None, None, None, limit))
        finally:
            reader.close()
        return [_decode(values) for values in page]

    async def delete(self, request_ids: Sequence[str]) -> int:
        """Remove the rows with these request_ids in one synced transaction; ids that are
        not there are skipped. Returns how many rows went. The usage ledger never deletes:
        this is for the Redis ledger's spool (``policies.ledger.spool``), which removes rows
        once Redis has them. It runs on its own connection in a worker thread; SQLite's lock
        (``busy_timeout``) serialises it with the writer thread."""
        if self._closed:
            raise RuntimeError("the ledger is closed")
        if not request_ids:
            return 0
        return await asyncio.to_thread(_delete, self.path, list(request_ids))

    @property
    def commits(self) -> int:
        """Transactions committed by this ledger so far (for tests and metrics)."""
        return self._commits_before + (self._writer.commits if self._writer else 0)

    async def aclose(self) -> None:
        """Commit everything queued, then stop the writer. Idempotent."""
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.queue.put(_STOP)
            await asyncio.to_thread(writer.thread.join)
            self._commits_before += writer.commits


_TS = COLUMNS.index("ts")
_ID = COLUMNS.index("request_id")
_BOOLS = tuple(name for name, kind in _column_kinds().items() if kind == "bool")


def page_query(
    tenant: str | None,
    start: float | None,
    end: float | None,
    after: tuple[float, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """One page's SELECT on this backend's table (``base.keyset_page_query``)."""
    return keyset_page_query("usage", "?", tenant, start, end, after, limit)


class Reader:
    """A read connection whose queries run in worker threads, closed only when no query
    runs on it. A reader cancelled mid-query (a client that left an export, a replay task
    cancelled as its event loop closes) leaves its query running in a worker thread, and
    closing the connection under it crashes the process (a use-after-free in SQLite): so
    ``close`` while a query runs only asks, and the query's thread closes it when done.

    Waiting for the query's future instead is not enough: cancelling the task that wraps
    ``asyncio.to_thread`` (which the loop's shutdown does to every task) marks it done
    while its thread still runs."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._running = False
        self._closing = False

    @property
    def closed(self) -> bool:
        """True once ``close`` was called and no query runs (the connection is closed)."""
        with self._lock:
            return self._closing and not self._running

    async def fetch(self, query: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """All rows of ``query``, read in a worker thread. Raises ``sqlite3.ProgrammingError``
        after ``close``."""
        return await asyncio.to_thread(self._fetch, query, args)

    def close(self) -> None:
        """Close the connection now, or, while a query runs, as soon as it ends."""
        with self._lock:
            self._closing = True
            if self._running:
                return
        self.conn.close()

    def _fetch(self, query: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            if self._closing:  # queued before the close, started after it
                raise sqlite3.ProgrammingError("the reader is closed")
            self._running = True
        try:
            return self.conn.execute(query, args).fetchall()
        finally:
            with self._lock:
                self._running = False
                close = self._closing
            if close:
                self.conn.close()


_DELETE_CHUNK = 500  # ids per statement, under SQLite's limit on bound parameters


def _delete(path: Path, request_ids: Sequence[str]) -> int:
    conn = connect(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        removed = 0
        try:
            for at in range(0, len(request_ids), _DELETE_CHUNK):
                chunk = request_ids[at : at + _DELETE_CHUNK]
                marks = ", ".join("?" for _ in chunk)
                cursor = conn.execute(f"DELETE FROM usage WHERE request_id IN ({marks})", chunk)
                removed += cursor.rowcount
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return removed
    finally:
        conn.close()


def _decode(values: tuple[Any, ...]) -> UsageRow:
    fields = dict(zip(COLUMNS, values, strict=True))
    for name in _BOOLS:
        fields[name] = bool(fields[name])
    return UsageRow(**fields)
