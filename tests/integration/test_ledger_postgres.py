"""The Postgres ledger against the machine's real PostgreSQL: versioned migrations under the
advisory lock, group commit, outages (a loopback proxy in front of the server is cut and
resumed: connections die and are refused, as when Postgres goes away), the fail-fast period
on the injected clock, and the local spool that keeps rows through an outage and replays
them exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from core.clock import FakeClock
from core.tenancy import UsageRow
from policies.ledger.postgres import PostgresLedger
from policies.ledger.postgres_schema import COLUMNS, MIGRATIONS, TABLE, Migration, migrate
from policies.ledger.spool import SpoolingLedger
from policies.ledger.sqlite import SqliteLedger
from policies.pg import PostgresUnavailableError, connect
from policies.store.base import StoreUnavailableError
from tests.fixtures.postgres_server import TcpProxy
from tests.fixtures.spool_replay import TICK, eventually

pytestmark = pytest.mark.anyio
T0 = 1_714_521_600.0


def row(i: int, **extra) -> UsageRow:
    fields = {
        "request_id": f"req_{i:05d}",
        "ts": T0 + i,
        "tenant": "acme",
        "key_id": "key_a",
        "model": "fast",
        "provider": "oa",
        "upstream_model": "gpt-4o-mini",
        "prompt_tokens": i,
        "completion_tokens": 3,
        **extra,
    }
    return UsageRow(**fields)


async def query(dsn: str, sql: str, *args) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(sql, args or None)
        return await cursor.fetchall() if cursor.description else []


async def stored(dsn: str) -> list[str]:
    return [r[0] for r in await query(dsn, f"SELECT request_id FROM {TABLE} ORDER BY ts")]


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[TcpProxy]:
    port = int(psycopg.conninfo.conninfo_to_dict(pg_dsn).get("port") or 5432)
    forwarder = await TcpProxy(port).start()
    yield forwarder
    await forwarder.cut()


# ---------------------------------------------------------------- migrations


async def test_a_fresh_database_gets_every_step_and_a_second_open_applies_nothing(pg_dsn):
    conn = await connect(pg_dsn, timeout_s=5, application_name="test")
    assert await migrate(conn) == [m.version for m in MIGRATIONS]
    assert await migrate(conn) == []
    recorded = await query(
        pg_dsn, "SELECT component, version, name FROM schema_migrations ORDER BY version"
    )
    assert recorded == [("ledger", m.version, m.name) for m in MIGRATIONS]
    await conn.close()
    ledger = PostgresLedger(pg_dsn, FakeClock())
    await ledger.prepare()  # a second process opening the ledger: nothing more to do
    assert len(await query(pg_dsn, "SELECT * FROM schema_migrations")) == len(MIGRATIONS)
    await ledger.aclose()


async def test_the_table_has_a_column_for_every_usage_row_field(pg_dsn):
    ledger = PostgresLedger(pg_dsn, FakeClock())
    await ledger.prepare()
    columns = await query(
        pg_dsn,
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_name = %s AND table_schema = current_schema()",
        TABLE,
    )
    # A field added to UsageRow needs a migration step: this fails until it has one.
    assert set(COLUMNS) <= {c for (c,) in columns}
    await ledger.aclose()


async def test_a_database_at_version_1_is_brought_to_the_latest(pg_dsn):
    conn = await connect(pg_dsn, timeout_s=5, application_name="test")
    assert await migrate(conn, MIGRATIONS[:1]) == [1]  # what the first release left
    await conn.execute(f"INSERT INTO {TABLE} (request_id, ts) VALUES ('req_old', 1.0)")
    await conn.close()
    ledger = PostgresLedger(pg_dsn, FakeClock())
    await ledger.append(row(1, tags='{"team":"a"}'))  # opening it migrates the rest
    versions = await query(pg_dsn, "SELECT version FROM schema_migrations ORDER BY version")
    assert [v for (v,) in versions] == [m.version for m in MIGRATIONS]
    got = [r async for r in ledger.rows()]
    assert [(r.request_id, r.tags) for r in got] == [
        ("req_old", None),
        ("req_00001", '{"team":"a"}'),
    ]
    await ledger.aclose()


async def test_replicas_starting_together_migrate_once(pg_dsn):
    conns = [await connect(pg_dsn, timeout_s=5, application_name="test") for _ in range(5)]
    results = await asyncio.gather(*(migrate(c) for c in conns))
    assert sorted(results) == [[], [], [], [], [m.version for m in MIGRATIONS]]
    for conn in conns:
        await conn.close()


async def test_a_failing_step_leaves_the_database_as_it_was(pg_dsn):
    conn = await connect(pg_dsn, timeout_s=5, application_name="test")
    broken = (
        *MIGRATIONS,
        Migration(len(MIGRATIONS) + 1, "broken", ("ALTER TABLE nowhere ADD x int",)),
    )
    with pytest.raises(psycopg.errors.UndefinedTable):
        await migrate(conn, broken)
    assert await query(
        pg_dsn, "SELECT to_regclass('schema_migrations')::text, to_regclass(%s)::text", TABLE
    ) == [(None, None)]
    assert await migrate(conn) == [m.version for m in MIGRATIONS]  # the good steps still apply
    await conn.close()


async def test_versions_a_newer_release_applied_are_left_alone(pg_dsn):
    conn = await connect(pg_dsn, timeout_s=5, application_name="test")
    newer = (*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "newer", ("CREATE TABLE later (x int)",)))
    await migrate(conn, newer)
    assert await migrate(conn) == []  # the older release starts and changes nothing
    await conn.close()


def test_migration_versions_must_run_1_to_n():
    step = MIGRATIONS[0]
    for versions in ([2], [1, 3], [1, 1]):
        steps = [Migration(v, step.name, step.statements) for v in versions]
        with pytest.raises(ValueError, match=r"1\.\.n"):
            asyncio.run(migrate(None, steps))  # type: ignore[arg-type]  # refused before any I/O


# ---------------------------------------------------------------- outages


async def test_an_unreachable_server_fails_fast_then_is_tried_again(pg_dsn, proxy: TcpProxy):
    clock = FakeClock()
    ledger = PostgresLedger(proxy.dsn(pg_dsn), clock, retry_interval_s=5.0)
    await ledger.append(row(1))
    await proxy.cut()
    with pytest.raises(PostgresUnavailableError):
        await ledger.append(row(2))  # the live connection is cut under the commit
    assert ledger.failures == 1 and not ledger.available
    before = proxy.accepted
    for i in range(3, 20):  # inside the fail-fast period: no network attempt at all
        with pytest.raises(PostgresUnavailableError, match="retrying later"):
            await ledger.append(row(i))
    with pytest.raises(StoreUnavailableError):
        [r async for r in ledger.rows()]
    assert proxy.accepted == before
    await proxy.start()
    clock.advance(5.0)
    await ledger.append(row(20))  # tried again: a new connection
    assert await stored(pg_dsn) == ["req_00001", "req_00020"]
    await ledger.aclose()


async def test_a_closed_port_is_reported_as_unreachable(pg_dsn):
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, port=str(TcpProxy(1).port))  # nobody there
    ledger = PostgresLedger(dsn, FakeClock(), timeout_s=1.0)
    with pytest.raises(PostgresUnavailableError, match="postgres unreachable"):
        await ledger.prepare()
    with pytest.raises(PostgresUnavailableError):
        await ledger.append(row(1))
    await ledger.aclose()


def spooling(dsn: str, path: Path, clock: FakeClock, **options) -> SpoolingLedger:
    options.setdefault("replay_interval_s", TICK)
    return SpoolingLedger(PostgresLedger(dsn, clock), SqliteLedger(path), clock, **options)


async def in_spool(path: Path) -> list[UsageRow]:
    return [r async for r in SqliteLedger(path).rows()]


async def test_rows_appended_while_postgres_is_away_reach_it_once_it_is_back(
    pg_dsn, proxy: TcpProxy, tmp_path
):
    clock = FakeClock()
    path = tmp_path / "spool.db"
    ledger = spooling(proxy.dsn(pg_dsn), path, clock)
    await ledger.start()  # connects and migrates
    rows = [row(i) for i in range(60)]
    await asyncio.gather(*(ledger.append(r) for r in rows[:20]))
    await proxy.cut()
    await asyncio.gather(*(ledger.append(r) for r in rows[20:40]))  # all return normally
    for r in rows[40:]:
        await ledger.append(r)
    assert ledger.spooled == 40 and await in_spool(path) == rows[20:]
    for _ in range(5):  # replays keep failing while it is away; nothing is lost
        clock.advance(TICK)
        await asyncio.sleep(TICK * 2)
    assert await in_spool(path) == rows[20:]
    assert await stored(pg_dsn) == [r.request_id for r in rows[:20]]
    await proxy.start()
    clock.advance(1.0)  # the ledger's fail-fast period is over

    async def replayed() -> bool:
        return not await in_spool(path)

    await eventually(replayed, clock)
    assert await stored(pg_dsn) == [r.request_id for r in rows]
    assert ledger.replayed == 40
    assert [r async for r in ledger.rows()] == rows
    await ledger.aclose()


async def test_rows_that_landed_without_acknowledgement_are_not_doubled(pg_dsn, tmp_path):
    path = tmp_path / "spool.db"
    rows = [row(i) for i in range(25)]
    direct = PostgresLedger(pg_dsn, FakeClock())
    await asyncio.gather(*(direct.append(r) for r in rows[:15]))  # committed...
    await direct.aclose()
    leftovers = SqliteLedger(path)  # ...but also spooled, as when the commit's answer was lost
    await asyncio.gather(*(leftovers.append(r) for r in rows))
    await leftovers.aclose()
    clock = FakeClock()
    ledger = spooling(pg_dsn, path, clock, batch_rows=10)
    await ledger.start()  # a restart replays what the spool holds

    async def replayed() -> bool:
        return not await in_spool(path)

    await eventually(replayed, clock)
    assert await stored(pg_dsn) == [r.request_id for r in rows]  # each once
    assert ledger.replayed == 25
    assert ledger.primary.commits <= 3  # a spool batch of 10 rows is one transaction
    await ledger.aclose()


async def test_a_bad_row_fails_alone(pg_dsn):
    ledger = PostgresLedger(pg_dsn, FakeClock())
    await ledger.prepare()
    await query(pg_dsn, f"ALTER TABLE {TABLE} ADD CONSTRAINT small CHECK (prompt_tokens < 1000)")
    rows = [row(i) for i in range(5)] + [row(5, prompt_tokens=5000)] + [row(i) for i in range(6, 9)]
    outcomes = await asyncio.gather(*(ledger.append(r) for r in rows), return_exceptions=True)
    assert [type(o).__name__ for o in outcomes] == ["NoneType"] * 5 + ["CheckViolation"] + [
        "NoneType"
    ] * 3
    assert await stored(pg_dsn) == [r.request_id for r in rows if r.prompt_tokens < 1000]
    assert ledger.available  # a bug is not an outage: no fail-fast period
    await ledger.aclose()


async def test_close_commits_what_is_queued_and_refuses_more(pg_dsn):
    ledger = PostgresLedger(pg_dsn, FakeClock(), max_wait_s=0.05)
    pending = [asyncio.create_task(ledger.append(row(i))) for i in range(30)]
    await asyncio.sleep(0)
    await ledger.aclose()
    await asyncio.gather(*pending)
    assert len(await stored(pg_dsn)) == 30
    with pytest.raises(RuntimeError):
        await ledger.append(row(99))
    await ledger.aclose()  # idempotent


async def test_a_spooled_row_postgres_refuses_does_not_hold_up_the_others(pg_dsn, tmp_path):
    path = tmp_path / "spool.db"
    rows = [row(i, prompt_tokens=5000 if i == 3 else i) for i in range(12)]
    leftovers = SqliteLedger(path)
    await asyncio.gather(*(leftovers.append(r) for r in rows))
    await leftovers.aclose()
    ledger = spooling(pg_dsn, path, FakeClock(), batch_rows=5, replay_interval_s=3600.0)
    await ledger.primary.prepare()
    await query(pg_dsn, f"ALTER TABLE {TABLE} ADD CONSTRAINT small CHECK (prompt_tokens < 1000)")
    with pytest.raises(psycopg.errors.CheckViolation):
        await ledger.replay()
    # the batch with the refused row went row by row: only that row stays, and each later
    # replay moves the rows behind it (a batch less one per attempt)
    assert [r.request_id for r in await in_spool(path)] == [
        "req_00003",
        *(r.request_id for r in rows[5:]),
    ]
    for _ in range(2):
        with pytest.raises(psycopg.errors.CheckViolation):
            await ledger.replay()
    assert [r.request_id for r in await in_spool(path)] == ["req_00003"]
    await query(pg_dsn, f"ALTER TABLE {TABLE} DROP CONSTRAINT small")  # the operator's fix
    assert await ledger.replay() == 1
    assert await stored(pg_dsn) == [r.request_id for r in rows] and await in_spool(path) == []
    await ledger.aclose()


async def test_the_writer_commits_durably_even_where_the_default_is_off(pg_dsn):
    options = psycopg.conninfo.conninfo_to_dict(pg_dsn).get("options", "")
    lax = psycopg.conninfo.make_conninfo(pg_dsn, options=f"{options} -c synchronous_commit=off")
    ledger = PostgresLedger(lax, FakeClock())
    writer = await ledger._writer()  # the connection appends use
    cursor = await writer.execute("SHOW synchronous_commit")
    assert await cursor.fetchone() == ("on",)
    await ledger.aclose()


async def test_start_and_the_first_appends_share_one_writer_connection(pg_dsn):
    ledger = PostgresLedger(pg_dsn, FakeClock(), max_wait_s=0.0)
    await asyncio.gather(ledger.prepare(), *(ledger.append(row(i)) for i in range(3)))
    await ledger.prepare()
    writers = await query(
        pg_dsn,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = 'ledger' AND datname = current_database()",
    )
    assert writers == [(1,)]
    await ledger.aclose()
