"""The job store's side of provider batches (``policies.jobs.remote``) on SQLite and
PostgreSQL: a batch is claimed whole by one owner while its lease holds, the provider's id
is recorded once and only by the holder, a claim after the lease ran out resumes with that
id (poll, not submit), ``finish`` writes every item and the counters in one step and only
for the holder, a refused submit backs off, and the item-by-item claim never sees such a
batch."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.clock import FakeClock
from policies.jobs import JobStore
from policies.jobs.batches import Pending
from policies.jobs.jsonl import parse_jsonl
from policies.jobs.objects import BatchCreate
from policies.jobs.postgres import PostgresJobs
from policies.jobs.remote import Outcome
from policies.jobs.usage import ItemUsage
from tests.unit.test_jobs_store import ACME, jsonl

LEASE_S = 30.0
pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request, tmp_path) -> AsyncIterator[JobStore]:
    clock = FakeClock(start=1_000.0, wall_start=1_700_000_000.0)
    if request.param == "sqlite":
        where = tmp_path / "jobs.sqlite3"
    else:
        where = PostgresJobs(request.getfixturevalue("pg_dsn"))
    opened = JobStore(where, clock, retention_s=86_400)
    await opened.open()
    yield opened
    await opened.aclose()


async def provider_batch(store: JobStore, count: int) -> str:
    content = jsonl(count)
    file = await store.add_file(ACME, filename="in.jsonl", purpose="batch", content=content)
    body = BatchCreate(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await store.create_batch(ACME, body, 86_400)
    (pending,) = await store.validating(10)
    assert isinstance(pending, Pending)
    requests, _ = parse_jsonl(content, endpoint=pending.endpoint)
    assert await store.start(pending, requests, provider="oa")
    return batch.id


async def test_a_provider_batch_is_claimed_whole_and_resumed_by_id(store: JobStore) -> None:
    batch_id = await provider_batch(store, 3)
    assert await store.claim("runner", 10, LEASE_S) == []  # never item by item
    first = await store.claim_remote("a", LEASE_S)
    assert first is not None and first.provider == "oa" and first.provider_batch_id is None
    assert [i.line for i in first.items] == [1, 2, 3]
    assert await store.claim_remote("b", LEASE_S) is None  # a's lease holds
    assert not await store.record_remote_id("b", batch_id, "remote-b")  # b does not hold it
    assert await store.record_remote_id("a", batch_id, "remote-a")
    assert not await store.record_remote_id("a", batch_id, "remote-again")  # once

    store.clock.advance(LEASE_S + 1)  # type: ignore[attr-defined]  # a died
    resumed = await store.claim_remote("b", LEASE_S)
    assert resumed is not None and resumed.provider_batch_id == "remote-a"
    outcomes = [
        Outcome(1, True, b'{"line": 1}', ItemUsage(10, 0, 5, 0)),
        Outcome(2, True, b'{"line": 2}', ItemUsage(20, 4, 5, 0)),
        Outcome(3, False, b'{"line": 3}', ItemUsage()),
    ]
    assert not await store.finish_remote("a", batch_id, outcomes, "chat")  # lost it
    assert await store.finish_remote("b", batch_id, outcomes, "chat")
    assert await store.settled() == [batch_id]
    assert await store.finalize(batch_id)
    batch = await store.batch(ACME, batch_id)
    assert batch is not None and batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    assert batch.usage is not None and batch.usage.input_tokens == 30 and batch.model == "chat"


async def test_a_refused_submit_backs_off_and_an_unsubmitted_batch_can_go_back(
    store: JobStore,
) -> None:
    batch_id = await provider_batch(store, 2)
    claim = await store.claim_remote("a", LEASE_S)
    assert claim is not None and claim.attempts == 0
    assert await store.back_off_remote("a", batch_id, 5.0) == 2
    assert await store.claim_remote("a", LEASE_S) is None  # not before the back-off
    store.clock.advance(6)  # type: ignore[attr-defined]
    again = await store.claim_remote("a", LEASE_S)
    assert again is not None and again.attempts == 1
    assert await store.unroute_remote("a", batch_id)  # no longer a provider batch
    assert await store.claim_remote("a", LEASE_S) is None
    assert [c.line for c in await store.claim("runner", 10, LEASE_S)] == [1, 2]


async def test_a_cancelled_submitted_batch_is_left_to_its_loop(store: JobStore) -> None:
    batch_id = await provider_batch(store, 2)
    claim = await store.claim_remote("a", LEASE_S)
    assert claim is not None
    assert await store.record_remote_id("a", batch_id, "remote-a")
    await store.release("a")  # the gateway stopped
    await store.cancel(ACME, batch_id)
    assert await store.remote_closing(batch_id) == "cancelled"
    assert await store.drop_stopped() == 0  # not dropped: the provider may have answered
    resumed = await store.claim_remote("b", LEASE_S)
    assert resumed is not None and resumed.closing == "cancelled"
    assert resumed.provider_batch_id == "remote-a"
