"""The usage ledger: one row per request, committed durably, exported later.

``Ledger`` (``base``) is the contract; ``open_ledger(config, redis_store)`` builds the backend
that ``LedgerConfig`` names: ``SqliteLedger`` (``sqlite``, the embedded default), or one
shared by replicas behind a ``SpoolingLedger`` (``spool``), which keeps rows in a local
SQLite file (``ledger.spool_path``) while the shared backend is unreachable and replays
them when it is back: ``RedisStreamLedger`` (``redis_stream``) or ``PostgresLedger``
(``postgres``, a table in the database ``ledger.dsn`` or ``$ledger.dsn_env`` names).
``auto`` means the Redis stream when ``state.backend`` is redis, else SQLite (never
Postgres: that is always asked for by name). Backends are imported only when chosen, so
neither the Redis client nor psycopg is loaded by a gateway that does not use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from core.clock import Clock, SystemClock
from core.config import Config, relative_to_config
from policies.ledger.base import PAGE_ROWS, Ledger, matches

if TYPE_CHECKING:
    from policies.store.redis import RedisStore

__all__ = [
    "PAGE_ROWS",
    "Ledger",
    "ledger_backend",
    "matches",
    "open_ledger",
    "spool_path",
    "sqlite_path",
]


def ledger_backend(config: Config) -> Literal["sqlite", "redis", "postgres"]:
    """The backend ``config`` selects, with ``auto`` resolved."""
    backend = config.ledger.backend
    if backend == "auto":
        return "redis" if config.state.backend == "redis" else "sqlite"
    return backend


def sqlite_path(config: Config) -> Path:
    """The SQLite ledger's file; a relative ``ledger.path`` starts at the policy file."""
    return relative_to_config(config, config.ledger.path)


def spool_path(config: Config) -> Path:
    """The shared ledger's spool file (Redis, Postgres); a relative ``ledger.spool_path``
    starts at the policy file."""
    return relative_to_config(config, config.ledger.spool_path)


def open_ledger(
    config: Config,
    redis_store: RedisStore | None = None,
    *,
    env: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> Ledger:
    """The ledger ``config`` names. The Redis backend borrows ``redis_store`` (the gateway's
    ``RedisStore``) and raises ``ValueError`` without one; it spools to ``spool_path`` while
    Redis is down. The Postgres backend reads ``$ledger.dsn_env`` from ``env`` (default: the
    process environment; ``ConfigError`` when unset), fails fast on ``clock`` (default: the
    system's) after an outage, and spools the same way; it connects on first use, not here.
    SQLite files (the ledger's, the spool) are created (with their folder) if needed,
    raising ``sqlite3.Error``/``OSError`` if they cannot be."""
    backend = ledger_backend(config)
    if backend == "postgres":
        return _postgres(config, env, clock or SystemClock())
    if backend == "redis":
        if redis_store is None:
            raise ValueError("ledger backend redis needs the RedisStore (state.backend: redis)")
        from policies.ledger.redis_stream import RedisStreamLedger
        from policies.ledger.spool import SpoolingLedger
        from policies.ledger.sqlite import SqliteLedger

        primary = RedisStreamLedger(redis_store, maxlen=config.ledger.stream_maxlen)
        return SpoolingLedger(primary, SqliteLedger(spool_path(config)), redis_store.clock)
    from policies.ledger.sqlite import SqliteLedger

    return SqliteLedger(sqlite_path(config))


def _postgres(config: Config, env: Mapping[str, str] | None, clock: Clock) -> Ledger:
    from policies.ledger.postgres import PostgresLedger
    from policies.ledger.spool import SpoolingLedger
    from policies.ledger.sqlite import SqliteLedger
    from policies.pg import resolve_dsn

    settings = config.ledger
    dsn = resolve_dsn(settings.dsn, settings.dsn_env, env, section="ledger")
    primary = PostgresLedger(
        dsn,
        clock,
        batch_rows=settings.batch_rows,
        max_wait_s=settings.max_wait_ms / 1000.0,
        timeout_s=settings.timeout_s,
        retry_interval_s=settings.retry_interval_s,
    )
    return SpoolingLedger(primary, SqliteLedger(spool_path(config)), clock)
