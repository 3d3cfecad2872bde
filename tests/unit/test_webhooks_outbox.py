"""The webhook outbox (policies/jobs/outbox.py) on a real job store (SQLite and Postgres)
with a fake clock: each status change queues its event in the same transaction (once,
even when two replicas race to finalize), only for tenants whose webhook wants it (``*``
for the rest and the open gateway); claims lease a row to one sender; an attempt's outcome
is written only by its holder; retries wait for their time; the log filters; the sweep
keeps pending rows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.clock import FakeClock
from core.config_batch import WebhookConfig
from core.tenancy import OPEN, Principal
from policies.jobs import JobStore
from policies.jobs.jsonl import parse_jsonl
from policies.jobs.objects import Batch, BatchCreate, BatchError, answered_line
from policies.jobs.outbox import endpoint_for
from policies.jobs.postgres import PostgresJobs
from tests.unit.test_jobs_store import jobs_at

pytestmark = pytest.mark.anyio
ACME = Principal(tenant="acme", key_id="k1", via="api_key")
GLOBEX = Principal(tenant="globex", key_id="k2", via="api_key")
DAY = 86_400
LEASE_S = 20.0
__all__ = ["jobs_at"]  # the store's fixture: every test here runs on SQLite and Postgres
HOOK = WebhookConfig(url="https://hooks.example/acme", secret_env="ACME_SECRET")
EVERYONE = WebhookConfig(
    url="https://hooks.example/ops",
    secret_env="OPS_SECRET",
    events=("batch.completed", "batch.in_progress"),
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(jobs_at: Path | PostgresJobs, clock: FakeClock) -> AsyncIterator[JobStore]:
    store = JobStore(jobs_at, clock, retention_s=7 * DAY)
    store.webhooks = {"acme": HOOK}
    await store.open()
    yield store
    await store.aclose()


def one_request() -> bytes:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    line = {"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line).encode()


async def new_batch(store: JobStore, principal: Principal = ACME) -> Batch:
    file = await store.add_file(
        principal, filename="in.jsonl", purpose="batch", content=one_request()
    )
    body = BatchCreate(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return await store.create_batch(principal, body, DAY)


async def completed_batch(store: JobStore, principal: Principal = ACME) -> Batch:
    batch = await new_batch(store, principal)
    (pending,) = [p for p in await store.validating(10) if p.id == batch.id]
    assert await store.start(pending, parse_jsonl(one_request())[0])
    (item,) = await store.claim("runner", 1, 60.0)
    line = answered_line(item.custom_id, 200, "req_x", b"{}")
    assert await store.finish("runner", item, ok=True, result=line) == (True, True)
    return batch


async def events(store: JobStore, **filters: str) -> list[tuple[str, str, str]]:
    rows = await store.deliveries(**filters)
    return [(row.type, row.batch_id, row.state) for row in rows]


# ---------------------------------------------------------------- what gets queued
def test_a_tenant_gets_its_own_webhook_else_the_star_one() -> None:
    hooks = {"acme": HOOK, "*": EVERYONE}
    assert endpoint_for(hooks, "acme", "batch.completed") == "acme"
    assert endpoint_for(hooks, "acme", "batch.in_progress") is None  # acme's wants OpenAI's
    assert endpoint_for(hooks, "globex", "batch.completed") == "*"
    assert endpoint_for(hooks, "", "batch.in_progress") == "*"  # the open gateway
    assert endpoint_for(hooks, "globex", "batch.failed") is None  # * did not ask for it
    assert endpoint_for({"acme": HOOK}, "globex", "batch.completed") is None


async def test_finalizing_queues_one_event_even_when_replicas_race(store, jobs_at, clock):
    batch = await completed_batch(store)
    other = JobStore(jobs_at, clock, retention_s=7 * DAY)
    other.webhooks = store.webhooks
    try:
        assert await store.finalize(batch.id) is True
        assert await other.finalize(batch.id) is False  # the second replica finds it final
    finally:
        await other.aclose()
    (row,) = await store.deliveries(batch_id=batch.id)
    assert (row.type, row.state, row.attempts, row.tenant, row.endpoint) == (
        "batch.completed",
        "pending",
        0,
        "acme",
        "acme",
    )
    payload = json.loads(bytes(row.payload))
    assert payload == {
        "id": row.id,
        "type": "batch.completed",
        "created_at": int(clock.wall()),
        "data": {"id": batch.id},
        "object": "event",
    }
    assert row.id.startswith("evt_") and "." not in row.id  # safe inside the signed string


async def test_every_ending_queues_its_openai_event(store, clock):
    failed = await new_batch(store)
    assert await store.fail(failed.id, [BatchError(code="empty_file", message="x")])
    cancelled = await new_batch(store)
    await store.cancel(ACME, cancelled.id)  # still validating: cancelled at once
    expired = await new_batch(store)
    clock.advance(DAY)
    assert await store.expire_due() >= 1
    assert set(await events(store)) == {
        ("batch.failed", failed.id, "pending"),
        ("batch.cancelled", cancelled.id, "pending"),
        ("batch.expired", expired.id, "pending"),
    }


async def test_no_webhook_no_rows_and_star_covers_the_rest(store):
    await store.finalize((await completed_batch(store, GLOBEX)).id)
    assert await events(store) == []  # globex has no webhook and there is no "*"
    store.webhooks = {"acme": HOOK, "*": EVERYONE}
    open_batch = await completed_batch(store, OPEN)  # queues batch.in_progress for "*"
    await store.finalize(open_batch.id)
    rows = await store.deliveries(batch_id=open_batch.id)
    assert sorted((r.type, r.endpoint, r.tenant) for r in rows) == [
        ("batch.completed", "*", None),
        ("batch.in_progress", "*", None),
    ]


# ---------------------------------------------------------------- claims and outcomes
async def test_a_row_is_sent_by_one_sender_while_its_lease_holds(store, clock):
    batch = await completed_batch(store)
    await store.finalize(batch.id)
    (claimed,) = await store.claim_deliveries("a", 10, LEASE_S)
    assert claimed.batch_id == batch.id and claimed.attempts == 0
    assert await store.claim_deliveries("b", 10, LEASE_S) == []
    assert await store.next_delivery_at() == pytest.approx(clock.wall() + LEASE_S)
    assert not await store.delivered("b", claimed.id, url="u", status=200)  # not b's
    clock.advance(LEASE_S + 1)  # a died: the row is due again, for b
    (again,) = await store.claim_deliveries("b", 10, LEASE_S)
    assert again.id == claimed.id
    assert not await store.delivered("a", claimed.id, url="u", status=200)  # a lost it
    assert await store.delivered("b", claimed.id, url="https://x/", status=204)
    (row,) = await store.deliveries()
    assert (row.state, row.attempts, row.last_status, row.url) == (
        "delivered",
        1,
        204,
        "https://x/",
    )
    assert row.delivered_at == clock.wall() and row.next_attempt_at is None
    assert await store.next_delivery_at() is None


async def test_a_failed_attempt_waits_for_its_time_then_fails_for_good(store, clock):
    await store.finalize((await completed_batch(store)).id)
    (first,) = await store.claim_deliveries("a", 1, LEASE_S)
    assert await store.delivery_failed(
        "a", first.id, url="https://x/", status=500, error="answered 500", retry_in_s=30.0
    )
    assert await store.claim_deliveries("a", 1, LEASE_S) == []
    assert await store.next_delivery_at() == pytest.approx(clock.wall() + 30.0)
    clock.advance(30.0)
    (second,) = await store.claim_deliveries("a", 1, LEASE_S)
    assert second.attempts == 1
    await store.delivery_failed(
        "a", second.id, url=None, status=None, error="e" * 900, retry_in_s=None
    )
    (row,) = await store.deliveries(state="failed")
    assert (row.attempts, row.last_status, len(row.last_error or "")) == (2, None, 500)
    assert await store.claim_deliveries("a", 1, LEASE_S) == []
    assert await store.next_delivery_at() is None


async def test_a_stopping_sender_hands_its_rows_back_at_once(store):
    await store.finalize((await completed_batch(store)).id)
    assert len(await store.claim_deliveries("a", 5, LEASE_S)) == 1
    assert await store.release_deliveries("a") == 1
    assert len(await store.claim_deliveries("b", 5, LEASE_S)) == 1


# ---------------------------------------------------------------- the log and the sweep
async def test_the_log_filters_and_the_sweep_keeps_what_is_pending(store, clock):
    store.webhooks = {"acme": HOOK, "globex": HOOK}
    ours = await completed_batch(store)
    theirs = await completed_batch(store, GLOBEX)
    await store.finalize(ours.id)
    await store.finalize(theirs.id)
    assert [b for _, b, _ in await events(store)] == [theirs.id, ours.id]  # newest first
    assert await events(store, tenant="acme") == [("batch.completed", ours.id, "pending")]
    assert await events(store, batch_id=theirs.id, state="delivered") == []
    assert len(await store.deliveries(limit=1)) == 1
    (claimed,) = await store.claim_deliveries("a", 1, LEASE_S)
    assert await store.delivered("a", claimed.id, url="u", status=200)
    clock.advance(7 * DAY + 1)
    assert await store.sweep_deliveries() == 1  # the delivered one; the pending one stays
    assert [row.state for row in await store.deliveries()] == ["pending"]
