"""A key's tags (``UsageRow.tags``) survive every ledger backend a row passes through: the
SQLite ledger (also one created before the field existed: the column is added on open,
older rows read back as None) and the Redis stream (a real redis-server)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from core.clock import SystemClock
from core.config_tenants import RedisConfig
from core.tenancy import UsageRow
from policies.control import tags_json
from policies.ledger.redis_stream import RedisStreamLedger
from policies.ledger.sqlite import SqliteLedger
from policies.store.redis import RedisStore

pytestmark = pytest.mark.anyio
TAGS = tags_json({"team": "search", "cost_center": "42"})


def row(request_id: str, tags: str | None) -> UsageRow:
    return UsageRow(
        request_id=request_id,
        ts=time.time(),
        tenant="acme",
        key_id="0123456789ab",
        model="chat",
        provider="oa",
        upstream_model="m",
        tags=tags,
    )


async def test_sqlite_keeps_tags_and_adds_the_column_to_an_older_file(tmp_path) -> None:
    path = tmp_path / "usage.sqlite3"
    conn = sqlite3.connect(path)  # a ledger written before ``tags`` existed
    conn.execute("CREATE TABLE usage (request_id TEXT PRIMARY KEY, ts REAL, tenant TEXT)")
    conn.execute("INSERT INTO usage VALUES ('req_old', 1.0, 'acme')")
    conn.commit()
    conn.close()
    ledger = SqliteLedger(path)
    try:
        await ledger.append(row("req_new", TAGS))
        rows = {r.request_id: r for r in [r async for r in ledger.rows(tenant="acme")]}
    finally:
        await ledger.aclose()
    assert rows["req_new"].tags == TAGS == '{"cost_center":"42","team":"search"}'
    assert rows["req_old"].tags is None


async def test_the_redis_stream_keeps_tags(redis_url: str) -> None:
    store = RedisStore(RedisConfig(url=redis_url), SystemClock())
    ledger = RedisStreamLedger(store)
    try:
        await ledger.append(row("req_a", TAGS))
        await ledger.append(row("req_b", None))
        rows = {r.request_id: r.tags async for r in ledger.rows(tenant="acme")}
    finally:
        await ledger.aclose()
        await store.aclose()
    assert rows == {"req_a": TAGS, "req_b": None}
