"""The seam between the job store's SQL and its two databases (SQLite, PostgreSQL).

The store's functions (``files``, ``batches``, ``work``, ``finalize``, ``outbox``) take a
``Db`` and write each statement once, with ``?`` and ``:name`` placeholders and SQL both
databases read the same way. What differs lives here:

- placeholders: psycopg wants ``%s`` / ``%(name)s``; ``PostgresDb`` translates each
  statement's text once (cached) and doubles any literal ``%``;
- transactions: ``write()`` is ``BEGIN IMMEDIATE`` on SQLite (one writer per file; other
  processes wait ``busy_timeout``), a plain READ COMMITTED ``BEGIN`` on Postgres, where
  writers run side by side;
- row locks: ``lock()`` is empty on SQLite (the write transaction holds the whole file)
  and ``FOR UPDATE`` (``OF`` one table, ``SKIP LOCKED``) on Postgres. Every statement that
  reads a row and then changes it based on what it read uses it, so replicas that race
  for one step apply it once; claims skip rows another replica is taking;
- NUL: Postgres text cannot hold NUL, so a ``str`` parameter's NUL becomes U+FFFD. Ids the
  store generates never hold one (a lookup with one misses, as it should), ``jsonl``
  refuses custom_ids with one, and a filename keeps the rest of its characters;
- results: Postgres rows come in binary format (a 200 MB BYTEA is 200 MB on the wire, not
  400 MB of hex), with the same Python types as SQLite's (int, float, str, bytes, None;
  a comparison is a bool where SQLite gives 0/1).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache
from typing import Any, Literal, Protocol

import psycopg

Params = Sequence[Any] | Mapping[str, Any]
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")  # :name, not a ::cast


class Cursor(Protocol):
    """What the store reads from a statement it ran."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Db(Protocol):
    """One connection to the job store's database, used by one thread."""

    dialect: Literal["sqlite", "postgres"]

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        """Run one statement (in autocommit unless inside ``write()``)."""
        ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter row."""
        ...

    def write(self) -> AbstractContextManager[None]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        ...

    def lock(self, of: str | None = None, *, skip_locked: bool = False) -> str:
        """The row-locking clause to end a SELECT with (see the module docstring)."""
        ...

    def usable(self) -> bool:
        """Whether the connection may serve the next call (after an error, it may not)."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    """Where a job store lives: opens connections and tells outages from bugs."""

    def open(self) -> Db:
        """A new connection, the schema brought up to date."""
        ...

    def unreachable(self, exc: BaseException) -> str | None:
        """Why ``exc`` means the database cannot be used now (503, retry later), or None
        when it is a bug or a refusal that must propagate unchanged."""
        ...


class SqliteDb:
    """``Db`` on an autocommit ``sqlite3`` connection."""

    dialect: Literal["sqlite", "postgres"] = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    @contextmanager
    def write(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def lock(self, of: str | None = None, *, skip_locked: bool = False) -> str:
        return ""

    def usable(self) -> bool:
        return not self.conn.in_transaction

    def close(self) -> None:
        self.conn.close()


class PostgresDb:
    """``Db`` on an autocommit psycopg (sync) connection."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        return self.conn.execute(to_psycopg(sql), _clean(params), binary=True)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.conn.cursor() as cursor:
            cursor.executemany(to_psycopg(sql), [_clean(row) for row in rows])

    @contextmanager
    def write(self) -> Iterator[None]:
        with self.conn.transaction():
            yield

    def lock(self, of: str | None = None, *, skip_locked: bool = False) -> str:
        return " FOR UPDATE" + (f" OF {of}" if of else "") + (" SKIP LOCKED" if skip_locked else "")

    def usable(self) -> bool:
        idle = psycopg.pq.TransactionStatus.IDLE
        return not self.conn.closed and self.conn.info.transaction_status == idle

    def close(self) -> None:
        self.conn.close()


@lru_cache(maxsize=512)
def to_psycopg(sql: str) -> str:
    """``sql`` with psycopg's placeholders: ``?`` -> ``%s``, ``:name`` -> ``%(name)s``
    (the store's SQL has no ``?`` or ``:`` inside string literals)."""
    return _NAMED.sub(r"%(\1)s", sql.replace("%", "%%").replace("?", "%s"))


def _clean(params: Params) -> Params:
    if isinstance(params, Mapping):
        return {key: _no_nul(value) for key, value in params.items()}
    return [_no_nul(value) for value in params]


def _no_nul(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value
