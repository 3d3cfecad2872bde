"""PostgreSQL connection helpers shared by the parts that keep state in Postgres (the usage
ledger, the control store). Driver: psycopg 3, async; pools from psycopg-pool.

- ``resolve_dsn``: the connection string from the policy file (``dsn``) or, better, from
  the environment variable it names (``dsn_env``: a Kubernetes Secret holds the password);
  a missing one is a ``ConfigError`` naming the setting.
- ``connect``: one autocommit connection (transactions are explicit), opened within
  ``timeout_s`` (libpq's ``connect_timeout`` plus an asyncio bound, since libpq rounds it).
- ``open_pool``: an ``AsyncConnectionPool`` with the same connection settings, a bounded
  wait for a connection (``timeout_s``), and a liveness check on each checkout, so a pooled
  connection that a restart of Postgres broke is replaced rather than handed out.
- ``unreachable``/``is_unreachable``: what counts as "Postgres cannot be reached now"
  (refused or lost connections, timeouts, a server shutting down or starting, a pool with
  no connection to give, a read-only standby after a failover), raised as
  ``PostgresUnavailableError``, a ``StoreUnavailableError``: the ledger's spool and the
  HTTP routes (503) already treat that as an outage. Other database errors (a constraint,
  a syntax error) are bugs, not outages, and propagate unchanged.

Messages never contain the DSN (it may hold a password); psycopg's own messages name only
the host and port.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from core.config import ConfigError
from policies.store.base import StoreUnavailableError

__all__ = [
    "Connection",
    "PostgresUnavailableError",
    "connect",
    "is_unreachable",
    "open_pool",
    "resolve_dsn",
    "unreachable",
]

Connection = psycopg.AsyncConnection[tuple[Any, ...]]

# libpq waits at least 2 s however small connect_timeout is; the asyncio bound is exact.
_LIBPQ_MIN_CONNECT_S = 2


class PostgresUnavailableError(StoreUnavailableError):
    """Postgres could not be reached in time (see ``is_unreachable``)."""


def resolve_dsn(
    dsn: str | None, dsn_env: str | None, env: Mapping[str, str] | None = None, *, section: str
) -> str:
    """The DSN: ``dsn`` itself, else the value of the variable ``dsn_env`` in ``env``
    (default: the process environment). ``ConfigError`` naming ``<section>.dsn_env`` when
    that variable is unset or empty, or ``<section>.dsn`` when neither is given."""
    if dsn:
        return dsn
    if dsn_env:
        value = (os.environ if env is None else env).get(dsn_env, "").strip()
        if not value:
            raise ConfigError([f"{section}.dsn_env: the environment variable {dsn_env} is unset"])
        return value
    raise ConfigError([f"{section}.dsn: needed (or dsn_env) for the postgres backend"])


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means the server cannot be used now, as opposed to a bug: every
    ``OperationalError`` (connection refused or lost, admin shutdown, server starting,
    pool timeout, too many connections), a read-only transaction (a standby), an I/O error
    or a timeout. Not a deadlock or a serialization failure: the server is fine, the
    transaction lost a race (an ``OperationalError`` subclass in psycopg)."""
    if isinstance(exc, (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)):
        return False
    return isinstance(
        exc,
        (
            psycopg.OperationalError,
            psycopg.errors.ReadOnlySqlTransaction,
            OSError,
            TimeoutError,
        ),
    )


@contextlib.asynccontextmanager
async def unreachable(what: str) -> AsyncIterator[None]:
    """Turn reachability failures inside the block into ``PostgresUnavailableError``
    ("<what>: postgres unreachable: <reason>"); anything else propagates unchanged."""
    try:
        yield
    except PostgresUnavailableError:
        raise
    except Exception as exc:
        if is_unreachable(exc):
            reason = str(exc).strip() or type(exc).__name__
            raise PostgresUnavailableError(f"{what}: postgres unreachable: {reason}") from exc
        raise


def _connection_kwargs(timeout_s: float, application_name: str) -> dict[str, Any]:
    return {
        "autocommit": True,
        "connect_timeout": max(_LIBPQ_MIN_CONNECT_S, math.ceil(timeout_s)),
        "application_name": application_name,
    }


async def connect(dsn: str, *, timeout_s: float, application_name: str) -> Connection:
    """A new autocommit connection, within ``timeout_s``; ``PostgresUnavailableError``
    when the server cannot be reached (a bad password or database name reads the same:
    the server refuses the connection)."""
    kwargs = _connection_kwargs(timeout_s, application_name)
    async with unreachable("connect"), asyncio.timeout(timeout_s):
        return await psycopg.AsyncConnection.connect(dsn, **kwargs)


async def open_pool(
    dsn: str,
    *,
    name: str,
    timeout_s: float = 2.0,
    min_size: int = 1,
    max_size: int = 4,
) -> AsyncConnectionPool[Connection]:
    """An opened pool of autocommit connections named ``name`` (also their
    ``application_name``). It does not wait for its first connection: while Postgres is
    down, ``pool.connection()`` raises ``PoolTimeout`` after ``timeout_s`` (wrap it in
    ``unreachable``), and the pool keeps reconnecting in the background. Close it with
    ``await pool.close()``."""
    pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=timeout_s,
        kwargs=_connection_kwargs(timeout_s, name),
        check=AsyncConnectionPool.check_connection,
        open=False,
    )
    await pool.open(wait=False)
    return pool
