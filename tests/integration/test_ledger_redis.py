"""The Redis Stream usage ledger against a real redis-server: ids from row times, the
per-tenant stream, idempotency, paging, time filters with late rows, trimming, outages."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator

import msgspec
import pytest

from core.clock import FakeClock
from core.config import parse_config
from core.config_tenants import RedisConfig
from core.tenancy import UsageRow
from gateway.cli import usage as cli_usage
from policies.ledger import matches, open_ledger
from policies.ledger.export import export_lines, prime
from policies.ledger.redis_stream import RedisStreamLedger
from policies.store.base import StoreUnavailableError
from policies.store.redis import RedisStore
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.anyio
T0 = 1_714_521_600.0  # 2024-05-01T00:00:00Z


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
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(redis_url: str, clock: FakeClock) -> AsyncIterator[RedisStore]:
    redis_store = RedisStore(RedisConfig(url=redis_url, key_prefix="t:", timeout_s=1.0), clock)
    yield redis_store
    await redis_store.aclose()


async def read(ledger: RedisStreamLedger, **filters) -> list[UsageRow]:
    return [r async for r in ledger.rows(**filters)]


async def test_rows_come_back_in_order_with_ids_from_their_times(store):
    ledger = RedisStreamLedger(store)
    rows = [row(i, ts=T0 + i * 1.5) for i in range(20)]
    for r in rows:
        await ledger.append(r)
    assert await read(ledger) == rows
    entries = await store.client.xrange("t:ledger", count=3)
    assert [e[0] for e in entries] == [b"1714521600000-0", b"1714521601500-0", b"1714521603000-0"]
    await ledger.aclose()


async def test_concurrent_appends_from_many_requests_are_all_kept(store):
    ledger = RedisStreamLedger(store, page_rows=50)
    rows = [row(i, tenant=f"t{i % 3}", ts=T0 + (i % 17)) for i in range(600)]
    await asyncio.gather(*(ledger.append(r) for r in rows))
    got = await read(ledger)
    assert sorted(got, key=lambda r: r.request_id) == rows
    assert await store.client.xlen("t:ledger") == 600


async def test_a_retried_append_is_counted_once(store):
    ledger = RedisStreamLedger(store, dedup_ttl_s=60)
    await ledger.append(row(1, cost_usd=0.5))
    await asyncio.gather(*(ledger.append(row(1, cost_usd=0.9)) for _ in range(5)))
    assert [r.cost_usd for r in await read(ledger)] == [0.5]
    assert [r.cost_usd for r in await read(ledger, tenant="acme")] == [0.5]
    ttl_ms = await store.client.pttl("t:ledger:seen:req_00001")
    assert 0 < ttl_ms <= 60_000  # the marker expires: it must not grow without bound


async def test_a_tenant_export_reads_only_that_tenants_stream(store, monkeypatch):
    ledger = RedisStreamLedger(store, page_rows=4)
    rows = [row(i, tenant=["acme", "zeta", None][i % 3]) for i in range(30)]
    for r in rows:
        await ledger.append(r)
    assert await store.client.xlen("t:ledger:tenant:acme") == 10
    assert await store.client.xlen("t:ledger:tenant:zeta") == 10
    keys: list[str] = []
    xrange = store.client.xrange

    async def recording(key, *args, **kwargs):
        keys.append(key)
        return await xrange(key, *args, **kwargs)

    monkeypatch.setattr(store.client, "xrange", recording)
    assert await read(ledger, tenant="zeta") == [r for r in rows if r.tenant == "zeta"]
    assert set(keys) == {"t:ledger:tenant:zeta"} and len(keys) == 3  # 10 rows, pages of 4
    assert len(await read(ledger)) == 30  # every tenant's, the untenanted ones included


@pytest.mark.parametrize("count", [0, 6, 7, 8, 21])
async def test_pages_cover_every_row_once_with_equal_times(store, count):
    ledger = RedisStreamLedger(store, page_rows=7)
    rows = [row(i, ts=T0 + i // 4) for i in range(count)]  # 4 entries share each ms
    for r in rows:
        await ledger.append(r)
    assert await read(ledger) == rows


async def test_time_filters_find_rows_that_were_appended_late(store):
    ledger = RedisStreamLedger(store, page_rows=5)
    # Requests that end out of order: row 1 started before row 0 but was appended after it.
    order = [row(0, ts=T0 + 100), row(1, ts=T0 + 50), row(2, ts=T0 + 120), row(3, ts=T0 + 10)]
    order += [row(i, ts=T0 + 200 + i) for i in range(4, 20)]
    for r in order:
        await ledger.append(r)
    entries = await store.client.xrange("t:ledger")
    ids = [int(e[0].split(b"-")[0]) for e in entries]
    assert ids == sorted(ids)  # ids still grow
    assert all(i >= int(r.ts * 1000) for i, r in zip(ids, order, strict=True))  # never early
    for start, end in [(T0 + 40, T0 + 60), (T0, T0 + 101), (None, T0 + 11), (T0 + 205, None)]:
        expected = [r for r in order if matches(r, None, start, end)]
        assert await read(ledger, start=start, end=end) == expected
        tenant_rows = await read(ledger, tenant="acme", start=start, end=end)
        assert tenant_rows == expected


async def test_maxlen_trims_only_when_configured(store):
    untrimmed = RedisStreamLedger(store)
    for i in range(300):
        await untrimmed.append(row(i, tenant=None))
    assert await store.client.xlen("t:ledger") == 300
    await store.client.delete("t:ledger")
    trimmed = RedisStreamLedger(store, maxlen=10)
    for i in range(300, 900):
        await trimmed.append(row(i, tenant="acme"))
    for key in ("t:ledger", "t:ledger:tenant:acme"):
        length = await store.client.xlen(key)
        assert 10 <= length < 600  # approximate: at least maxlen, the oldest dropped
    assert (await read(trimmed))[-1].request_id == "req_00899"


async def test_open_ledger_builds_the_stream_from_the_config(store, tmp_path):
    config = parse_config("state: {backend: redis}\nledger: {stream_maxlen: 5000}")
    config = msgspec.structs.replace(config, source=str(tmp_path / "config.yaml"))
    ledger = open_ledger(config, store)
    assert isinstance(ledger.primary, RedisStreamLedger) and ledger.primary.maxlen == 5000
    await ledger.append(row(1))
    assert await read(ledger) == [row(1)]
    await ledger.aclose()


async def test_exports_stream_from_redis(store):
    ledger = RedisStreamLedger(store, page_rows=3)
    for i in range(10):
        await ledger.append(row(i))
    lines = [line async for line in export_lines(ledger.rows(tenant="acme"), "csv", "day")]
    assert len(lines) == 2 and b",acme," in lines[1] and b",10,0," in lines[1]


async def test_an_unreachable_redis_raises_and_recovers(
    store, redis_server: RedisServer, clock: FakeClock
):
    ledger = RedisStreamLedger(store)
    await ledger.append(row(1))
    redis_server.stop()
    try:
        with pytest.raises(StoreUnavailableError):
            await ledger.append(row(2))
        with pytest.raises(StoreUnavailableError):
            await prime(ledger.rows())  # the routes turn this into a 503 before streaming
    finally:
        redis_server.start()
    clock.advance(store.config.retry_interval_s)
    await ledger.append(row(3))
    # redis-server here runs without persistence, so the restart emptied it
    assert [r.request_id for r in await read(ledger)] == ["req_00003"]


async def test_the_cli_exports_from_the_redis_stream(store, redis_url, tmp_path, capsys):
    ledger = RedisStreamLedger(store)
    for i in range(12):
        await ledger.append(row(i, tenant=["acme", "zeta"][i % 2]))
    (tmp_path / "config.yaml").write_text(
        f'state: {{backend: redis, redis: {{url: "{redis_url}", key_prefix: "t:"}}}}\n'
    )
    parser = argparse.ArgumentParser()
    cli_usage.add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "zeta.jsonl"
    config = str(tmp_path / "config.yaml")
    args = parser.parse_args(
        ["usage", "export", "--config", config, "--tenant", "zeta", "--out", str(out)]
    )
    assert await asyncio.to_thread(cli_usage.run, args) == 0
    ids = [json.loads(line)["request_id"] for line in out.read_text().splitlines()]
    assert ids == [f"req_{i:05d}" for i in range(1, 12, 2)]
    assert "rows read: 6" in capsys.readouterr().err
