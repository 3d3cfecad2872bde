"""``ledger.backend: postgres`` in the policy file (validation, ``auto`` unchanged), what
``open_ledger`` builds from it, and the shared helpers of ``policies.pg`` (DSN from the
environment, connections and pools with bounded waits, the outage mapping) against the
machine's PostgreSQL and a port nobody listens on."""

from __future__ import annotations

import time

import msgspec
import psycopg
import pytest

from core.clock import FakeClock
from core.config import ConfigError, parse_config
from policies.ledger import ledger_backend, open_ledger
from policies.ledger.postgres import PostgresLedger
from policies.ledger.spool import SpoolingLedger
from policies.ledger.sqlite import SqliteLedger
from policies.pg import (
    PostgresUnavailableError,
    connect,
    is_unreachable,
    open_pool,
    resolve_dsn,
    unreachable,
)
from policies.store.base import StoreUnavailableError
from tests.fixtures.server import free_port

pytestmark = pytest.mark.anyio


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return caught.value.errors


@pytest.mark.parametrize(
    ("ledger", "expected"),
    [
        ("{backend: postgres}", "ledger.dsn: backend postgres needs dsn, or dsn_env"),
        ("{backend: postgres, dsn: ''}", "ledger.dsn: backend postgres needs dsn, or dsn_env"),
        ("{backend: postgres, dsn: 'host=db', dsn_env: DB}", "ledger.dsn_env: give dsn or"),
        ("{dsn: 'host=db'}", "ledger.dsn: only backend postgres uses it"),
        ("{backend: sqlite, dsn_env: DB}", "ledger.dsn_env: only backend postgres uses it"),
        ("{backend: postgres, dsn_env: 'not a name'}", "ledger.dsn_env: Expected `str` matching"),
        ("{backend: postgres, dsn: x, batch_rows: 0}", "ledger.batch_rows: Expected `int` >= 1"),
        ("{backend: postgres, dsn: x, max_wait_ms: -1}", "ledger.max_wait_ms: Expected `float` >="),
        ("{backend: postgres, dsn: x, timeout_s: 0}", "ledger.timeout_s: Expected `float` > 0"),
        ("{backend: mysql}", "ledger.backend: Invalid enum value 'mysql'"),
    ],
)
def test_bad_postgres_settings_are_refused_with_the_setting_named(ledger, expected):
    errors = errors_of(f"ledger: {ledger}")
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_auto_keeps_its_meaning():
    assert ledger_backend(parse_config("")) == "sqlite"
    assert ledger_backend(parse_config("state: {backend: redis}")) == "redis"
    named = parse_config("ledger: {backend: postgres, dsn_env: SWITCHYARD_LEDGER_DSN}")
    assert ledger_backend(named) == "postgres"
    assert named.ledger.batch_rows == 500 and named.ledger.max_wait_ms == 0.0


async def test_open_ledger_builds_a_spooled_postgres_ledger_from_the_environment(tmp_path):
    text = (
        "ledger: {backend: postgres, dsn_env: SWITCHYARD_LEDGER_DSN, spool_path: spool/l.db,"
        " batch_rows: 64, max_wait_ms: 2.5, timeout_s: 3, retry_interval_s: 4}"
    )
    config = msgspec.structs.replace(parse_config(text), source=str(tmp_path / "config.yaml"))
    clock = FakeClock()
    ledger = open_ledger(config, env={"SWITCHYARD_LEDGER_DSN": "host=db.internal"}, clock=clock)
    assert isinstance(ledger, SpoolingLedger) and isinstance(ledger.primary, PostgresLedger)
    primary = ledger.primary
    assert (primary.batch_rows, primary.max_wait_s, primary.timeout_s) == (64, 0.0025, 3.0)
    assert primary.retry_interval_s == 4.0 and primary.clock is clock and ledger.clock is clock
    assert isinstance(ledger.spool, SqliteLedger)
    assert ledger.spool.path == tmp_path / "spool" / "l.db"
    await ledger.aclose()  # never connected: nothing to flush
    with pytest.raises(ConfigError, match="SWITCHYARD_LEDGER_DSN is unset"):
        open_ledger(config, env={})


def test_resolve_dsn_prefers_the_inline_dsn_and_names_what_is_missing():
    assert resolve_dsn("host=a", None, {}, section="ledger") == "host=a"
    assert resolve_dsn(None, "X", {"X": " host=b "}, section="ledger") == "host=b"
    with pytest.raises(ConfigError, match=r"control\.dsn_env: the environment variable X"):
        resolve_dsn(None, "X", {"X": ""}, section="control")
    with pytest.raises(ConfigError, match=r"ledger\.dsn: needed"):
        resolve_dsn(None, None, {}, section="ledger")


def nobody_dsn() -> str:
    return f"host=127.0.0.1 port={free_port()} user=postgres dbname=postgres"


async def test_connect_to_a_closed_port_is_an_outage_not_a_bug():
    started = time.monotonic()
    with pytest.raises(PostgresUnavailableError, match="connect: postgres unreachable") as caught:
        await connect(nobody_dsn(), timeout_s=1.0, application_name="test")
    assert isinstance(caught.value, StoreUnavailableError)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    assert time.monotonic() - started < 30  # refused, not hung (a bound, not a timing claim)


async def test_the_outage_mapping_lets_bugs_through(pg_dsn):
    conn = await connect(pg_dsn, timeout_s=5.0, application_name="test")
    with pytest.raises(psycopg.errors.UndefinedTable):
        async with unreachable("query"):
            await conn.execute("SELECT * FROM no_such_table")
    await conn.close()
    with pytest.raises(PostgresUnavailableError, match="query: postgres unreachable"):
        async with unreachable("query"):
            await conn.execute("SELECT 1")  # closed: psycopg's OperationalError
    assert is_unreachable(TimeoutError()) and not is_unreachable(ValueError())
    # a lost race is not an outage: the server answered
    assert not is_unreachable(psycopg.errors.DeadlockDetected())
    assert not is_unreachable(psycopg.errors.SerializationFailure())


async def test_a_pool_serves_connections_and_reports_an_unreachable_server(pg_dsn):
    pool = await open_pool(pg_dsn, name="test-pool", timeout_s=5.0, max_size=2)
    async with pool.connection() as conn:
        cursor = await conn.execute("SELECT current_setting('application_name')")
        assert await cursor.fetchone() == ("test-pool",)
        assert conn.autocommit
    await pool.close()
    dead = await open_pool(nobody_dsn(), name="dead", timeout_s=0.5, min_size=0, max_size=1)
    with pytest.raises(PostgresUnavailableError, match="checkout: postgres unreachable"):
        async with unreachable("checkout"), dead.connection():
            pass
    await dead.close()
