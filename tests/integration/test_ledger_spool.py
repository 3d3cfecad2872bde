"""The Redis ledger's local spool against a real redis-server that is stopped mid-run: rows
appended while Redis is down are kept and replayed in order once it is back, without
duplicates when a replay is interrupted, and across a close and a new ledger."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from core.clock import FakeClock
from core.config import parse_config
from core.config_tenants import RedisConfig
from core.tenancy import UsageRow
from policies.ledger import open_ledger
from policies.ledger.redis_stream import RedisStreamLedger
from policies.ledger.spool import SpoolingLedger
from policies.ledger.sqlite import SqliteLedger
from policies.store.redis import RedisStore
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.spool_replay import TICK, eventually

pytestmark = pytest.mark.anyio
T0 = 1_714_521_600.0  # 2024-05-01T00:00:00Z


def row(i: int, *, tenant: str | None = "acme", **extra) -> UsageRow:
    fields = {
        "request_id": f"req_{i:05d}",
        "ts": T0 + i,
        "tenant": tenant,
        "key_id": "key_a",
        "model": "fast",
        "provider": "oa",
        "upstream_model": "gpt-4o-mini",
        "prompt_tokens": i,
        "completion_tokens": 3,
        "cost_usd": 1e-6 * i,
        **extra,
    }
    return UsageRow(**fields)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(redis_url: str, clock: FakeClock) -> AsyncIterator[RedisStore]:
    redis_store = RedisStore(RedisConfig(url=redis_url, key_prefix="t:", timeout_s=1.0), clock)
    yield redis_store
    await redis_store.aclose()


def spooling(store: RedisStore, path: Path, clock: FakeClock, **options) -> SpoolingLedger:
    options.setdefault("replay_interval_s", TICK)
    return SpoolingLedger(RedisStreamLedger(store), SqliteLedger(path), clock, **options)


async def in_stream(store: RedisStore, key: str = "t:ledger") -> list[UsageRow]:
    entries = await store.client.xrange(key)
    return [msgspec.json.decode(fields[b"row"], type=UsageRow) for _, fields in entries]


async def in_spool(path: Path) -> list[UsageRow]:
    """What the spool file holds, read by a separate ledger as another process would."""
    reader = SqliteLedger(path)
    return [r async for r in reader.rows()]


def back_up(redis_server: RedisServer, store: RedisStore, clock: FakeClock) -> None:
    """Restart Redis and let the store's fail-fast period (and the replay wait) pass."""
    redis_server.start()
    clock.advance(store.config.retry_interval_s + TICK)


async def test_rows_appended_while_redis_is_down_reach_the_stream_when_it_is_back(
    store, redis_server: RedisServer, clock: FakeClock, tmp_path
):
    path = tmp_path / "spool.db"
    ledger = spooling(store, path, clock)
    rows = [row(i, tenant=["acme", "zeta"][i % 2]) for i in range(40)]
    redis_server.stop()
    try:
        await asyncio.gather(*(ledger.append(r) for r in rows[:20]))  # all return normally
        for r in rows[20:]:  # the store now fails fast: straight to the spool
            await ledger.append(r)
        assert ledger.spooled == 40
        assert await in_spool(path) == rows
        for _ in range(5):  # the task keeps retrying while Redis is down, losing nothing
            clock.advance(TICK)
            await asyncio.sleep(TICK * 2)
        assert await in_spool(path) == rows
    finally:
        back_up(redis_server, store, clock)
    await eventually(lambda: _has(store, 40), clock)
    assert await in_stream(store) == rows  # in time order, each once
    assert await in_stream(store, "t:ledger:tenant:zeta") == rows[1::2]
    assert [r async for r in ledger.rows(tenant="acme")] == rows[0::2]
    await eventually(lambda: _spool_empty(path), clock)
    assert ledger.replayed == 40
    await ledger.append(row(40))  # Redis is healthy again: no spooling
    assert ledger.spooled == 40 and len(await in_stream(store)) == 41
    await ledger.aclose()


async def _has(store: RedisStore, count: int, key: str = "t:ledger") -> bool:
    return bool(await store.client.xlen(key) >= count)


async def _spool_empty(path: Path) -> bool:
    return not await in_spool(path)


async def test_a_healthy_redis_is_written_directly_and_the_spool_stays_empty(
    store, clock: FakeClock, tmp_path
):
    ledger = spooling(store, tmp_path / "spool.db", clock)
    rows = [row(i) for i in range(25)]
    await asyncio.gather(*(ledger.append(r) for r in rows))
    assert sorted(await in_stream(store), key=lambda r: r.request_id) == rows
    assert ledger.spooled == 0 and await in_spool(tmp_path / "spool.db") == []
    await ledger.aclose()
    with pytest.raises(RuntimeError):
        await ledger.append(row(99))


async def test_a_redis_that_refuses_writes_is_spooled_too(store, clock: FakeClock, tmp_path):
    ledger = spooling(store, tmp_path / "spool.db", clock)
    await store.client.config_set("maxmemory", 1)  # OOM: Redis answers, but refuses writes
    try:
        await ledger.append(row(1))
        assert await in_spool(tmp_path / "spool.db") == [row(1)]
        assert await store.client.xlen("t:ledger") == 0
    finally:
        await store.client.config_set("maxmemory", 0)
    clock.advance(TICK)
    await eventually(lambda: _has(store, 1), clock)
    assert await in_stream(store) == [row(1)]
    await ledger.aclose()
    assert await in_spool(tmp_path / "spool.db") == []


async def test_a_replay_interrupted_after_redis_took_the_rows_adds_no_duplicates(
    store, clock: FakeClock, tmp_path
):
    path = tmp_path / "spool.db"
    leftovers = SqliteLedger(path)  # what a previous run left behind
    rows = [row(i) for i in range(10)]
    await asyncio.gather(*(leftovers.append(r) for r in rows))
    await leftovers.aclose()

    first = spooling(store, path, clock, close_timeout_s=0.2)

    async def crash_before_delete(request_ids) -> int:
        # The process "dies" here: it waits until cancelled (by aclose, or its close
        # timeout). A call made once that cancellation is under way (replay's ``finally``
        # after a timeout that struck mid-batch) returns at once, as the real delete does.
        task = asyncio.current_task()
        if task is None or not task.cancelling():
            await asyncio.Event().wait()
        return 0

    first.spool.delete = crash_before_delete  # type: ignore[method-assign]
    await first.start()
    await eventually(lambda: _has(store, 10), clock)
    await first.aclose()  # its last replay appends the rows again (no-ops), then times out
    assert await in_spool(path) == rows  # Redis acknowledged them, but they were not deleted

    second = spooling(store, path, clock)
    await second.start()  # replays the same rows again
    await eventually(lambda: _spool_empty(path), clock)
    assert second.replayed == 10
    assert await in_stream(store) == rows  # each once
    assert await in_stream(store, "t:ledger:tenant:acme") == rows
    await second.aclose()


async def test_redis_going_down_mid_replay_keeps_the_rest_for_later(
    store, redis_server: RedisServer, clock: FakeClock, tmp_path
):
    path = tmp_path / "spool.db"
    ledger = spooling(store, path, clock, batch_rows=10)
    rows = [row(i) for i in range(30)]
    dump = Path(redis_server.dir) / "dump.rdb"
    redis_server.stop()
    try:
        for r in rows:
            await ledger.append(r)
        appended = 0
        append = ledger.primary.append

        async def down_at_the_15th(r: UsageRow) -> None:
            nonlocal appended
            appended += 1
            if appended == 15:  # keep the 14 rows replayed so far across the restart
                await store.client.save()
                redis_server.stop()
            await append(r)

        ledger.primary.append = down_at_the_15th  # type: ignore[method-assign]
        back_up(redis_server, store, clock)
        # rows 0-13 were acknowledged and deleted; row 14 onwards stays, none lost
        await eventually(lambda: _spool_is(path, rows[14:]), clock)
        assert not redis_server.running
        back_up(redis_server, store, clock)  # loads the 14 rows from dump.rdb
        await eventually(lambda: _spool_empty(path), clock)
        assert await in_stream(store) == rows
    finally:
        redis_server.start()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dump)  # a later restart must come back empty
    await ledger.aclose()


async def _spool_is(path: Path, rows: list[UsageRow]) -> bool:
    return await in_spool(path) == rows


@pytest.mark.parametrize("resume", ["start", "first append"])
async def test_rows_left_by_a_close_while_redis_is_down_are_replayed_by_the_next_ledger(
    store, redis_server: RedisServer, clock: FakeClock, tmp_path, resume
):
    path = tmp_path / "spool.db"
    first = spooling(store, path, clock)
    rows = [row(i) for i in range(12)]
    redis_server.stop()
    try:
        for r in rows:
            await first.append(r)
        await first.aclose()  # its last replay fails: the rows stay
        assert await in_spool(path) == rows
    finally:
        back_up(redis_server, store, clock)
    assert await store.client.xlen("t:ledger") == 0

    second = spooling(store, path, clock)
    if resume == "start":
        await second.start()
        expected = rows
    else:
        await second.append(row(50))  # nothing else needed: the first append looks too
        expected = [*rows, row(50)]
    await eventually(lambda: _spool_empty(path), clock)
    assert sorted(await in_stream(store), key=lambda r: r.ts) == expected
    await second.aclose()


async def test_close_replays_what_redis_takes(
    store, redis_server: RedisServer, clock: FakeClock, tmp_path
):
    path = tmp_path / "spool.db"
    ledger = spooling(store, path, clock, replay_interval_s=3600.0)  # no background retry
    rows = [row(i) for i in range(8)]
    redis_server.stop()
    try:
        for r in rows:
            await ledger.append(r)
    finally:
        back_up(redis_server, store, clock)
    assert await in_spool(path) == rows
    await ledger.aclose()
    assert await in_stream(store) == rows
    assert await in_spool(path) == []


async def test_open_ledger_spools_next_to_the_policy_file(store, tmp_path):
    config = parse_config(
        "state: {backend: redis}\nledger: {stream_maxlen: 5000, spool_path: spool/ledger.db}"
    )
    config = msgspec.structs.replace(config, source=str(tmp_path / "config.yaml"))
    ledger = open_ledger(config, store)
    assert isinstance(ledger, SpoolingLedger)
    assert ledger.primary.maxlen == 5000 and ledger.primary.store is store
    assert ledger.spool.path == tmp_path / "spool" / "ledger.db" and ledger.spool.path.exists()
    assert ledger.clock is store.clock
    await ledger.append(row(1))
    assert [r async for r in ledger.rows()] == [row(1)]
    await ledger.aclose()


async def test_the_sqlite_spool_pages_oldest_first_and_deletes_what_it_is_told(tmp_path):
    spool = SqliteLedger(tmp_path / "spool.db")
    rows = [row(i) for i in range(1200)]
    await asyncio.gather(*(spool.append(r) for r in reversed(rows)))
    assert await spool.oldest(3) == rows[:3]
    gone = [r.request_id for r in rows[:1100]] + ["req_missing"]
    assert await spool.delete(gone) == 1100  # more ids than one statement takes
    assert await spool.delete([]) == 0
    assert await spool.oldest(1000) == rows[1100:]
    await spool.aclose()
    with pytest.raises(RuntimeError):
        await spool.delete(["req_01100"])
