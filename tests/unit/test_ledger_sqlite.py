"""The SQLite usage ledger: durability (group commit, a killed process), idempotency,
keyset pagination and filters, on real files in tmp_path."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import parse_config
from core.tenancy import UsageRow
from policies.ledger import ledger_backend, matches, open_ledger
from policies.ledger.sqlite import Reader, SqliteLedger, connect, page_query

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
T0 = 1_714_521_600.0  # 2024-05-01T00:00:00Z


def row(i: int, *, tenant: str | None = "acme", ts: float | None = None, **extra) -> UsageRow:
    fields = {
        "request_id": f"req_{i:05d}",
        "ts": T0 + i if ts is None else ts,
        "tenant": tenant,
        "key_id": f"key_{i % 3}",
        "model": "gpt-4o-mini",
        "provider": "oa",
        "upstream_model": "gpt-4o-mini-2024-07-18",
        "stream": i % 2 == 0,
        "prompt_tokens": 10 + i,
        "completion_tokens": 5,
        "cost_usd": 0.000001 * (i + 1),
        "ttft_ms": None if i % 4 else 12.5,
        "cache_hit": i % 5 == 0,
        **extra,
    }
    return UsageRow(**fields)


async def read(ledger: SqliteLedger, **filters) -> list[UsageRow]:
    return [r async for r in ledger.rows(**filters)]


async def test_concurrent_appends_are_all_readable_and_share_commits(tmp_path):
    ledger = SqliteLedger(tmp_path / "usage.db")
    rows = [row(i, tenant=f"t{i % 4}") for i in range(1000)]
    await asyncio.gather(*(ledger.append(r) for r in rows))
    # group commit: many appends waiting at once ride on far fewer transactions
    assert 1 <= ledger.commits <= 500
    assert await read(ledger) == rows
    await ledger.aclose()


async def test_rows_round_trip_every_field(tmp_path):
    ledger = SqliteLedger(tmp_path / "usage.db")
    original = row(
        7, tenant=None, key_id=None, provider=None, upstream_model=None, error="upstream_timeout",
        status=504, cached_tokens=3, latency_ms=1234.5, queue_ms=2.25, attempts=3, fallbacks=1,
        endpoint="embeddings", stream=True, cache_hit=True, ttft_ms=99.875,
    )  # fmt: skip
    await ledger.append(original)
    [back] = await read(ledger)
    assert back == original
    assert type(back.stream) is bool and type(back.cache_hit) is bool
    await ledger.aclose()


async def test_the_same_request_id_is_counted_once(tmp_path):
    ledger = SqliteLedger(tmp_path / "usage.db")
    first = row(1, cost_usd=0.5)
    await ledger.append(first)
    await ledger.append(row(1, cost_usd=0.9))  # a retry, with a different cost
    await asyncio.gather(*(ledger.append(first) for _ in range(20)))
    assert await read(ledger) == [first]
    await ledger.aclose()


async def test_rows_survive_closing_and_reopening(tmp_path):
    path = tmp_path / "nested" / "usage.db"
    ledger = SqliteLedger(path)
    rows = [row(i) for i in range(30)]
    for r in rows:
        await ledger.append(r)
    await ledger.aclose()
    await ledger.aclose()  # idempotent
    with pytest.raises(RuntimeError):
        await ledger.append(row(99))
    again = SqliteLedger(path)
    assert await read(again) == rows
    await again.append(row(30))
    assert len(await read(again)) == 31
    await again.aclose()


async def test_a_cancelled_append_is_still_committed(tmp_path):
    ledger = SqliteLedger(tmp_path / "usage.db")
    task = asyncio.create_task(ledger.append(row(1)))
    await asyncio.sleep(0)  # let it enqueue the row
    task.cancel()
    await ledger.aclose()  # flushes the queue
    assert [r.request_id for r in await read(SqliteLedger(tmp_path / "usage.db"))] == ["req_00001"]


class Gated(sqlite3.Connection):
    """A read connection whose ``SELECT gate()`` runs until the test opens ``gate``, and
    which records a ``close`` that came while that query was still running."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.started, self.gate = threading.Event(), threading.Event()
        self.closed_mid_query = False
        self.create_function("gate", 0, self._wait_for_the_gate)

    def _wait_for_the_gate(self) -> int:
        self.started.set()
        return int(self.gate.wait(30))

    def close(self) -> None:
        self.closed_mid_query |= self.started.is_set() and not self.gate.is_set()
        super().close()


def gated_reader(path: Path) -> tuple[Reader, Gated]:
    SqliteLedger(path)  # the schema
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, factory=Gated)
    return Reader(conn), conn


async def test_a_reader_closed_mid_query_closes_when_the_query_ends(tmp_path):
    reader, conn = gated_reader(tmp_path / "usage.db")
    query = asyncio.create_task(reader.fetch("SELECT gate()", []))
    await asyncio.to_thread(conn.started.wait, 30)
    query.cancel()  # the caller leaves; its thread goes on
    with pytest.raises(asyncio.CancelledError):
        await query
    reader.close()
    assert not reader.closed
    conn.gate.set()
    async with asyncio.timeout(30):
        while not reader.closed:
            await asyncio.sleep(0.01)
    assert not conn.closed_mid_query
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # closed by the query's thread
    with pytest.raises(sqlite3.ProgrammingError):
        await reader.fetch("SELECT 1", [])


def test_a_query_cut_off_by_its_loop_closing_keeps_its_connection_until_it_ends(tmp_path):
    """What crashed a test run: a replay's ``oldest()`` still querying when the event
    loop shut down. The shutdown cancels every task, so the query's future is done while
    its thread still runs; the connection must not be closed under it."""
    reader, conn = gated_reader(tmp_path / "usage.db")

    async def read_then_close() -> None:
        try:
            await reader.fetch("SELECT gate()", [])
        finally:
            reader.close()
            conn.gate.set()  # only now: the close came while the query ran

    async def leave_it_running() -> None:
        asyncio.get_running_loop().create_task(read_then_close())
        await asyncio.to_thread(conn.started.wait, 30)

    asyncio.run(leave_it_running())  # cancels read_then_close mid-query, then waits for threads
    assert reader.closed and not conn.closed_mid_query
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")


async def test_wal_and_full_sync_are_on(tmp_path):
    ledger = SqliteLedger(tmp_path / "usage.db")
    await ledger.append(row(1))
    conn = sqlite3.connect(tmp_path / "usage.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    writer = connect(tmp_path / "usage.db")
    assert writer.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    writer.close()
    await ledger.aclose()


async def test_a_failed_commit_fails_its_appends_and_the_writer_goes_on(tmp_path):
    path = tmp_path / "usage.db"
    ledger = SqliteLedger(path)
    await ledger.append(row(1))
    other = sqlite3.connect(path)
    other.execute("DROP TABLE usage")
    other.commit()
    with pytest.raises(sqlite3.OperationalError):
        await ledger.append(row(2))
    SqliteLedger(path)  # recreates the schema
    await ledger.append(row(3))
    assert [r.request_id for r in await read(ledger)] == ["req_00003"]
    other.close()
    await ledger.aclose()


CHILD = """
import asyncio, sys
from core.tenancy import UsageRow
from policies.ledger.sqlite import SqliteLedger

def row(i):
    return UsageRow(request_id=f"r{i:06d}", ts=1714521600.0 + i, tenant="acme", key_id="k",
                    model="m", provider="p", upstream_model="u", prompt_tokens=i)

async def main():
    ledger = SqliteLedger(sys.argv[1])
    await asyncio.gather(*(ledger.append(row(i)) for i in range(300)))
    print("committed", flush=True)
    i = 300
    while True:  # keep writing, so the kill lands in the middle of commits
        await asyncio.gather(*(ledger.append(row(i + j)) for j in range(50)))
        i += 50

asyncio.run(main())
"""


def test_an_acknowledged_row_survives_sigkill(tmp_path):
    path = tmp_path / "usage.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"committed\n"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    ids = {r[0] for r in conn.execute("SELECT request_id FROM usage")}
    conn.close()
    assert {f"r{i:06d}" for i in range(300)} <= ids


@pytest.mark.parametrize("count", [0, 1, 6, 7, 8, 14, 15, 50])
async def test_pages_cover_every_row_once_across_boundaries(tmp_path, count):
    # Timestamps repeat, so page boundaries fall inside runs of equal ts: the keyset
    # (ts, request_id) must neither skip nor repeat rows there.
    ledger = SqliteLedger(tmp_path / "usage.db", page_rows=7)
    rows = [row(i, ts=T0 + i // 5) for i in range(count)]
    await asyncio.gather(*(ledger.append(r) for r in reversed(rows)))
    assert await read(ledger) == rows
    await ledger.aclose()


async def test_reading_does_not_load_everything_at_once(tmp_path, monkeypatch):
    from policies.ledger import sqlite as module

    ledger = SqliteLedger(tmp_path / "usage.db", page_rows=10)
    await asyncio.gather(*(ledger.append(row(i)) for i in range(95)))
    sizes: list[int] = []
    fetch = module.Reader._fetch

    def counting(self, query, args):
        page = fetch(self, query, args)
        sizes.append(len(page))
        return page

    monkeypatch.setattr(module.Reader, "_fetch", counting)
    seen = 0
    async for _ in ledger.rows():
        seen += 1
        assert sum(sizes) <= seen + 10  # never more than a page ahead of the consumer
    assert sizes == [10] * 9 + [5]
    await ledger.aclose()


filters = st.fixed_dictionaries(
    {},
    optional={
        "tenant": st.sampled_from(["t0", "t1", "t2", "nobody"]),
        "start": st.floats(T0 - 5, T0 + 45),
        "end": st.floats(T0 - 5, T0 + 45),
    },
)
_stored: dict[str, tuple[SqliteLedger, list[UsageRow]]] = {}


def stored_ledger() -> tuple[SqliteLedger, list[UsageRow]]:
    """One ledger for every example (built once), read with fresh filters each time."""
    if "ledger" not in _stored:
        path = Path(tempfile.mkdtemp(prefix="ledger-filters-")) / "usage.db"
        ledger = SqliteLedger(path, page_rows=4)
        rows = [row(i, tenant=[f"t{i % 3}", None][i % 7 == 0], ts=T0 + i / 2) for i in range(80)]

        async def fill() -> None:
            await asyncio.gather(*(ledger.append(r) for r in rows))
            await ledger.aclose()

        asyncio.run(fill())
        _stored["ledger"] = (ledger, rows)
    return _stored["ledger"]


@settings(max_examples=60, deadline=None)
@given(filters)
def test_filters_match_a_plain_python_filter(query):
    ledger, rows = stored_ledger()
    expected = [
        r for r in rows if matches(r, query.get("tenant"), query.get("start"), query.get("end"))
    ]
    assert asyncio.run(read(ledger, **query)) == sorted(
        expected, key=lambda r: (r.ts, r.request_id)
    )


def plan(path: Path, tenant, start, end) -> str:
    query, args = page_query(tenant, start, end, (T0, "req_1"), 1000)
    conn = sqlite3.connect(path)
    steps = conn.execute("EXPLAIN QUERY PLAN " + query, args).fetchall()
    conn.close()
    return " | ".join(step[-1] for step in steps)


def test_pages_are_index_range_scans(tmp_path):
    SqliteLedger(tmp_path / "usage.db")
    by_tenant = plan(tmp_path / "usage.db", "acme", T0, T0 + 86400)
    assert "usage_tenant_ts" in by_tenant and "SCAN" not in by_tenant
    assert "TEMP B-TREE" not in by_tenant  # no sort: the index gives the order
    by_time = plan(tmp_path / "usage.db", None, T0, None)
    assert "usage_ts" in by_time and "TEMP B-TREE" not in by_time


async def test_an_older_file_gains_new_columns_with_their_defaults(tmp_path):
    path = tmp_path / "usage.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE usage (request_id TEXT PRIMARY KEY, ts REAL, tenant TEXT, key_id TEXT,"
        " model TEXT, provider TEXT, upstream_model TEXT)"
    )
    conn.execute("INSERT INTO usage VALUES ('old', ?, 'acme', 'k', 'm', 'p', 'u')", (T0,))
    conn.commit()
    conn.close()
    ledger = SqliteLedger(path)
    [old] = await read(ledger)
    expected = UsageRow(
        request_id="old", ts=T0, tenant="acme", key_id="k", model="m", provider="p",
        upstream_model="u",
    )  # fmt: skip
    assert old == expected
    await ledger.append(row(1))
    assert len(await read(ledger)) == 2
    await ledger.aclose()


def test_open_ledger_picks_sqlite_next_to_the_policy_file(tmp_path):
    config = parse_config("ledger: {path: data/usage.db}")
    config = msgspec.structs.replace(config, source=str(tmp_path / "config.yaml"))
    assert ledger_backend(config) == "sqlite"
    ledger = open_ledger(config)
    assert isinstance(ledger, SqliteLedger)
    assert ledger.path == tmp_path / "data" / "usage.db"
    assert ledger.path.exists()


def test_auto_means_redis_when_the_state_is_in_redis():
    assert ledger_backend(parse_config("state: {backend: redis}")) == "redis"
    assert ledger_backend(parse_config("ledger: {backend: sqlite}")) == "sqlite"
    with pytest.raises(ValueError, match="RedisStore"):
        open_ledger(parse_config("state: {backend: redis}"))
