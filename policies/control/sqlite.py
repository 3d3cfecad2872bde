"""The control store on one SQLite file: the single-host backend (the gateway and the
``switchyard keys`` command on the same machine share it).

WAL journal with ``synchronous=FULL`` (a COMMIT is on disk when it returns), writes in
``BEGIN IMMEDIATE`` (one writer at a time, across processes, waiting up to
``busy_timeout``). One connection, used by one worker thread, so the event loop never waits
on the disk; one transaction at a time per process.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from policies.control.errors import ControlUnavailableError

T = TypeVar("T")


def _use_wal(conn: sqlite3.Connection, patience_s: float) -> None:
    """Switch the file to WAL. That needs the file to itself, and SQLite does not wait for
    it (no busy handler): processes opening a new file together retry for a while."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class _SqliteTx:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._db.call(lambda conn: conn.execute(sql, params).rowcount)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._db.call(lambda conn: conn.execute(sql, params).fetchall())


class SqliteDatabase:
    """``Database`` on the file at ``path`` (its folder is created)."""

    name = "sqlite"
    auto_id = "INTEGER PRIMARY KEY AUTOINCREMENT"
    migration_lock: str | None = None  # BEGIN IMMEDIATE already keeps other writers out

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self._busy_ms = int(busy_timeout_s * 1000)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            _use_wal(conn, self._busy_ms / 1000)
            conn.execute("PRAGMA synchronous=FULL")
            self._conn = conn
        return self._conn

    async def call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` on the connection in the worker thread."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, lambda: work(self._connect()))
        except (sqlite3.Error, OSError) as exc:  # locked too long, disk, a bad file
            raise ControlUnavailableError(f"control store {self.path}: {exc}") from exc

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[_SqliteTx]:
        async with self._lock:
            await self.call(lambda conn: conn.execute("BEGIN IMMEDIATE" if write else "BEGIN"))
            try:
                yield _SqliteTx(self)
                await self.call(lambda conn: conn.execute("COMMIT"))
            except BaseException:
                # shielded: a cancelled caller must not leave the transaction open
                await asyncio.shield(self.call(_rollback))
                raise

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._thread, conn.close)
        self._thread.shutdown(wait=False)
