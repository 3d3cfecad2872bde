"""The job store on the machine's real PostgreSQL, where replicas really run side by side
(each ``JobStore`` has its own connection and worker thread, so calls gathered together
hit the database at the same moment): versioned migrations under the advisory lock, next
to the ledger's; many stores claiming at once never take one item (or one webhook event)
twice; replicas racing to drop a stopping batch's items, or to finalize it, count each
item once and queue one event; a large file round-trips byte for byte. (The store's
behaviour on both backends is tests/unit/test_jobs_store.py's, parametrized.)"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import AsyncIterator

import psycopg
import pytest

from core.clock import FakeClock
from core.config_batch import WebhookConfig
from policies.jobs import JobStore
from policies.jobs.postgres import COMPONENT, MIGRATIONS, PostgresJobs, migrate
from policies.jobs.work import Claim
from policies.ledger import postgres_schema as ledger_schema
from policies.pg import connect
from tests.unit.test_jobs_store import ACME, GLOBEX, LEASE_S, line_for, running_batch

pytestmark = pytest.mark.anyio
REPLICAS = 4
HOOKS = {"*": WebhookConfig(url="https://hooks.example/ops", secret_env="OPS_SECRET")}


async def query(dsn: str, sql: str, *args: object) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(sql, args or None)
        return await cursor.fetchall() if cursor.description else []


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def stores(pg_dsn: str, clock: FakeClock) -> AsyncIterator[list[JobStore]]:
    """``REPLICAS`` job stores on one database, opened: the replicas of a fleet."""
    opened = [JobStore(PostgresJobs(pg_dsn), clock, retention_s=86_400) for _ in range(REPLICAS)]
    for store in opened:
        store.webhooks = HOOKS
    await asyncio.gather(*(store.open() for store in opened))
    yield opened
    for store in opened:
        await store.aclose()


# ---------------------------------------------------------------- migrations
async def test_a_fresh_database_gets_the_schema_once_beside_the_ledgers(pg_dsn, clock):
    store = JobStore(PostgresJobs(pg_dsn), clock, retention_s=60.0)
    await store.open()
    await store.aclose()
    ledger_conn = await connect(pg_dsn, timeout_s=5, application_name="test")
    assert await ledger_schema.migrate(ledger_conn) == [m.version for m in ledger_schema.MIGRATIONS]
    await ledger_conn.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert migrate(conn) == []  # a second opening: nothing left to do
    recorded = await query(
        pg_dsn,
        "SELECT component, version, name FROM schema_migrations WHERE component = %s",
        COMPONENT,
    )
    assert recorded == [(COMPONENT, m.version, m.name) for m in MIGRATIONS]
    tables = await query(
        pg_dsn,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()",
    )
    assert {"files", "batches", "items", "webhook_deliveries", "usage_ledger"} <= {
        name for (name,) in tables
    }


async def test_replicas_opening_together_migrate_once(pg_dsn, clock):
    replicas = [JobStore(PostgresJobs(pg_dsn), clock, retention_s=60.0) for _ in range(5)]
    await asyncio.gather(*(store.open() for store in replicas))  # no error: they waited
    for store in replicas:
        await store.aclose()
    versions = await query(
        pg_dsn, "SELECT version FROM schema_migrations WHERE component = %s", COMPONENT
    )
    assert sorted(versions) == [(m.version,) for m in MIGRATIONS]


# ---------------------------------------------------------------- replicas at the same moment
async def test_replicas_claiming_at_once_never_take_one_item_twice(stores):
    first = stores[0]
    await running_batch(first, 150, ACME)
    await running_batch(first, 150, GLOBEX)
    taken: list[tuple[JobStore, str, Claim]] = []
    for _ in range(300):  # rounds of every replica claiming together, until none is left
        rounds = await asyncio.gather(
            *(store.claim(f"r{i}", random.randint(1, 8), LEASE_S) for i, store in enumerate(stores))
        )
        got = [(stores[i], f"r{i}", claim) for i, claims in enumerate(rounds) for claim in claims]
        if not got:
            break
        taken.extend(got)
    items = Counter((claim.batch_id, claim.line) for _, _, claim in taken)
    assert len(items) == 300 and set(items.values()) == {1}  # each once, none left
    assert len({owner for _, owner, _ in taken}) == REPLICAS  # every replica took some
    finished = await asyncio.gather(
        *(
            store.finish(owner, claim, ok=True, result=line_for(claim.custom_id))
            for store, owner, claim in taken
        )
    )
    assert all(written for written, _ in finished)  # each holder still held its items
    assert len(await first.settled()) == 2


async def test_replicas_dropping_and_finalizing_together_count_each_item_once(stores):
    first = stores[0]
    batch = await running_batch(first, 60)
    running = await first.claim("runner", 10, LEASE_S)  # live leases: these finish
    await first.cancel(ACME, batch.id)
    dropped = await asyncio.gather(*(store.drop_stopped() for store in stores))
    assert sum(dropped) == 50
    for item in running:
        await first.finish("runner", item, ok=True, result=line_for(item.custom_id))
    finalized = await asyncio.gather(*(store.finalize(batch.id) for store in stores))
    assert sorted(finalized) == [False] * (REPLICAS - 1) + [True]
    final = await first.batch(ACME, batch.id)
    assert final is not None and final.status == "cancelled"
    counts = final.request_counts
    assert (counts.total, counts.completed, counts.failed) == (60, 10, 50)
    errors = await first.content(ACME, final.error_file_id or "")
    assert errors is not None
    custom_ids = [json.loads(line)["custom_id"] for line in errors[1].splitlines()]
    assert len(custom_ids) == len(set(custom_ids)) == 50
    events = await first.deliveries(batch_id=batch.id, state="pending")
    assert [e.type for e in events] == ["batch.cancelled"]  # one event, whoever won


async def test_senders_claiming_at_once_never_take_one_event_twice(stores):
    first = stores[0]
    for _ in range(30):
        batch = await running_batch(first, 1, GLOBEX)
        (item,) = await first.claim("runner", 1, LEASE_S)
        await first.finish("runner", item, ok=True, result=line_for(item.custom_id))
        assert await first.finalize(batch.id)
    taken: list[str] = []
    while True:
        rounds = await asyncio.gather(
            *(store.claim_deliveries(f"s{i}", 3, LEASE_S) for i, store in enumerate(stores))
        )
        got = [delivery.id for claims in rounds for delivery in claims]
        if not got:
            break
        taken.extend(got)
    assert len(taken) == len(set(taken)) == 30


async def test_a_large_file_round_trips_byte_for_byte(stores):
    content = random.Random(7).randbytes(32 * 1024 * 1024)  # NULs and every other byte
    store = stores[0]
    file = await store.add_file(ACME, filename="big.jsonl", purpose="batch", content=content)
    assert file.bytes == len(content)
    found = await stores[1].content(ACME, file.id)  # another replica reads it
    assert found is not None and found[1] == content
