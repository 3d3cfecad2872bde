"""The ``Ledger`` contract, run against every backend: SQLite (a temporary file), the Redis
stream (the session's real redis-server) and Postgres (a fresh database of each test's own
on the machine's PostgreSQL; see tests/fixtures/postgres_server.py for when that fails or
skips). Appends are idempotent on ``request_id`` (the first row wins), rows come back in
time order, page by page, with the read filters of ``policies.ledger.matches``, and a
burst of concurrent appends keeps every row while sharing commits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import pytest

from core.clock import FakeClock
from core.config_tenants import RedisConfig
from core.tenancy import UsageRow
from policies.ledger import Ledger, matches
from policies.ledger.export import export_lines
from policies.ledger.postgres import PostgresLedger
from policies.ledger.redis_stream import RedisStreamLedger
from policies.ledger.sqlite import SqliteLedger
from policies.store.redis import RedisStore

pytestmark = pytest.mark.anyio
T0 = 1_714_521_600.0  # 2024-05-01T00:00:00Z
BACKENDS = ["sqlite", "redis", "postgres"]
EXACT = ["sqlite", "postgres"]  # exact (ts, request_id) order whatever the append order

Factory = Callable[..., Ledger]


def row(i: int, *, tenant: str | None = "acme", ts: float | None = None, **extra) -> UsageRow:
    fields = {
        "request_id": f"req_{i:05d}",
        "ts": T0 + i if ts is None else ts,
        "tenant": tenant,
        "key_id": "key_a",
        "model": "fast",
        "provider": "oa",
        "upstream_model": "gpt-4o-mini",
        "prompt_tokens": i,
        "completion_tokens": 3,
        "cost_usd": 1e-6 * i,
        "stream": i % 2 == 1,
        **extra,
    }
    return UsageRow(**fields)


@pytest.fixture
async def make(request, tmp_path) -> AsyncIterator[Factory]:
    """``make(page_rows=...)``: a new ledger of the test's backend; closed at the end."""
    backend = request.param
    made: list[Ledger] = []
    store: RedisStore | None = None
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
        store = RedisStore(RedisConfig(url=url, key_prefix="c:", timeout_s=2.0), FakeClock())
    dsn = request.getfixturevalue("pg_dsn") if backend == "postgres" else ""

    def factory(page_rows: int = 1000) -> Ledger:
        ledger: Ledger
        if backend == "sqlite":
            ledger = SqliteLedger(tmp_path / "usage.sqlite3", page_rows=page_rows)
        elif backend == "redis":
            assert store is not None
            ledger = RedisStreamLedger(store, page_rows=page_rows)
        else:
            ledger = PostgresLedger(dsn, FakeClock(), page_rows=page_rows)
        made.append(ledger)
        return ledger

    yield factory
    for ledger in made:
        await ledger.aclose()
    if store is not None:
        await store.aclose()


def backends(names: list[str]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("make", names, indirect=True)


async def read(ledger: Ledger, **filters) -> list[UsageRow]:
    return [r async for r in ledger.rows(**filters)]


@backends(BACKENDS)
async def test_every_field_round_trips(make: Factory) -> None:
    ledger = make()
    full = row(
        1, status=499, error="client closed\x00 mid-stream", cached_tokens=7, ttft_ms=12.5,
        latency_ms=1234.25, queue_ms=3.0, attempts=2, fallbacks=1, cache_hit=True,
        client_request_id="abc-1", usage_estimated=True, tags='{"team":"a"}', endpoint="responses",
    )  # fmt: skip
    bare = row(2, tenant=None, key_id=None, model=None, provider=None, upstream_model=None)
    await ledger.append(full)
    await ledger.append(bare)
    got = await read(ledger)
    # Postgres text cannot hold NUL: it alone stores a replacement character instead.
    assert [r.request_id for r in got] == ["req_00001", "req_00002"]
    assert got[1] == bare
    assert got[0].error in (full.error, "client closed\ufffd mid-stream")
    assert got[0] == UsageRow(**{**_fields(full), "error": got[0].error})


def _fields(r: UsageRow) -> dict:
    return {name: getattr(r, name) for name in r.__struct_fields__}


@backends(BACKENDS)
async def test_a_retried_append_is_counted_once_and_the_first_row_wins(make: Factory) -> None:
    ledger = make()
    await ledger.append(row(1, cost_usd=0.5))
    await asyncio.gather(*(ledger.append(row(1, cost_usd=0.9)) for _ in range(5)))
    assert [r.cost_usd for r in await read(ledger)] == [0.5]
    assert [r.cost_usd for r in await read(ledger, tenant="acme")] == [0.5]


@backends(EXACT)
async def test_duplicates_inside_one_burst_keep_the_first(make: Factory) -> None:
    ledger = make()
    burst = [row(7, cost_usd=0.1), row(7, cost_usd=0.2), row(8), row(7, cost_usd=0.3)]
    await asyncio.gather(*(ledger.append(r) for r in burst))
    got = await read(ledger)
    assert [(r.request_id, r.cost_usd) for r in got] == [("req_00007", 0.1), ("req_00008", 8e-6)]


@backends(EXACT)
async def test_rows_come_back_in_ts_then_request_id_order_whatever_the_append_order(
    make: Factory,
) -> None:
    ledger = make(page_rows=4)
    rows = [row(i, ts=T0 + i // 3) for i in range(30)]  # three rows share each time
    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)
    for r in shuffled:
        await ledger.append(r)
    assert await read(ledger) == rows


@backends(BACKENDS)
@pytest.mark.parametrize("count", [0, 1, 6, 7, 8, 21])
async def test_pages_cover_every_row_once_with_equal_times(make: Factory, count: int) -> None:
    ledger = make(page_rows=7)
    rows = [row(i, ts=T0 + i // 4) for i in range(count)]  # 4 rows share each time
    for r in rows:
        await ledger.append(r)
    assert await read(ledger) == rows


@backends(BACKENDS)
async def test_filters_match_the_reference_filter(make: Factory) -> None:
    ledger = make(page_rows=5)
    rows = [row(i, tenant=["acme", "zeta", None][i % 3], ts=T0 + 10 * i) for i in range(40)]
    for r in rows:
        await ledger.append(r)
    windows = [(None, None), (T0 + 55, None), (None, T0 + 200), (T0 + 100, T0 + 101)]
    windows += [(T0 + 95, T0 + 305), (T0 + 1000, T0 + 2000)]
    for tenant in (None, "acme", "zeta", "nobody"):
        for start, end in windows:
            expected = [r for r in rows if matches(r, tenant, start, end)]
            got = await read(ledger, tenant=tenant, start=start, end=end)
            assert got == expected, (tenant, start, end)


@backends(BACKENDS)
async def test_200_concurrent_appends_keep_200_rows(make: Factory) -> None:
    ledger = make()
    rows = [row(i, tenant=f"t{i % 3}") for i in range(200)]
    await asyncio.gather(*(ledger.append(r) for r in rows))
    # the Redis stream keeps arrival order, which concurrency shuffles
    assert sorted(await read(ledger), key=lambda r: r.ts) == rows
    commits = getattr(ledger, "commits", None)  # the Redis stream has no transactions
    if commits is not None:
        assert 1 <= commits < len(rows)  # group commit: bursts share transactions


@backends(EXACT)
async def test_a_cancelled_append_is_still_committed(make: Factory) -> None:
    ledger = make()
    task = asyncio.create_task(ledger.append(row(1)))
    await asyncio.sleep(0)  # queued
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await ledger.append(row(2))  # committed after (or with) the cancelled one
    assert [r.request_id for r in await read(ledger)] == ["req_00001", "req_00002"]


@backends(BACKENDS)
async def test_a_day_export_sums_the_rows(make: Factory) -> None:
    ledger = make(page_rows=3)
    for i in range(10):
        await ledger.append(row(i))
    lines = [line async for line in export_lines(ledger.rows(tenant="acme"), "csv", "day")]
    assert len(lines) == 2 and b",acme," in lines[1] and b",10,0,45,30," in lines[1]
