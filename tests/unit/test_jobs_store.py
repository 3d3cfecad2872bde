"""The job store (policies/jobs) with a fake clock, every test on both backends (a real
SQLite file, and a fresh schema on the machine's PostgreSQL): claims and leases (no item
held by two owners, expired leases re-claimed, renewals keep them), finished items never
claimed again, tenant isolation, cancel, the completion window, retention, cursor pages,
and two stores on one database (two processes' view) sharing the work."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from core.clock import FakeClock
from core.errors import InvalidRequestError
from core.tenancy import Principal
from policies.jobs import JobStore
from policies.jobs.errors import ConflictError, NotFoundError
from policies.jobs.files import UnknownCursor
from policies.jobs.jsonl import parse_jsonl
from policies.jobs.objects import Batch, BatchCreate, BatchError, answered_line
from policies.jobs.postgres import PostgresJobs

pytestmark = pytest.mark.anyio
ACME = Principal(tenant="acme", key_id="k1", via="api_key")
GLOBEX = Principal(tenant="globex", key_id="k2", via="api_key")
DAY = 86_400
RETENTION_S = 7 * DAY
LEASE_S = 30.0


def jsonl(count: int, prefix: str = "r") -> bytes:
    lines = [
        {
            "custom_id": f"{prefix}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "chat", "messages": [{"role": "user", "content": f"q{i}"}]},
        }
        for i in range(count)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
def jobs_at(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PostgresJobs:
    """Where a test's job stores live: a SQLite file, or a schema of its own in the
    module's Postgres database (``pg_dsn``: fails under CI when Postgres is down)."""
    if request.param == "sqlite":
        return tmp_path / "jobs.sqlite3"
    return PostgresJobs(request.getfixturevalue("pg_dsn"))


@pytest.fixture
async def store(jobs_at: Path | PostgresJobs, clock: FakeClock) -> AsyncIterator[JobStore]:
    store = JobStore(jobs_at, clock, retention_s=RETENTION_S)
    await store.open()
    yield store
    await store.aclose()


async def running_batch(
    store: JobStore, count: int, principal: Principal = ACME, window_s: int = DAY
) -> Batch:
    """A batch of ``count`` chat requests, validated and in progress."""
    content = jsonl(count)
    file = await store.add_file(principal, filename="in.jsonl", purpose="batch", content=content)
    body = BatchCreate(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await store.create_batch(principal, body, window_s)
    assert batch.status == "validating"
    (pending,) = await store.validating(10)
    requests, errors = parse_jsonl(content, endpoint=pending.endpoint)
    assert errors == []
    assert await store.start(pending, requests)
    found = await store.batch(principal, batch.id)
    assert found is not None and found.status == "in_progress"
    return found


def line_for(custom_id: str, status: int = 200) -> bytes:
    return answered_line(custom_id, status, "req_x", b'{"ok": true}')


async def finish_all(store: JobStore, owner: str, claims: list, ok: bool = True) -> None:
    for item in claims:
        written, _ = await store.finish(owner, item, ok=ok, result=line_for(item.custom_id))
        assert written


# ---------------------------------------------------------------- claims and leases
async def test_an_item_is_held_by_one_owner_while_its_lease_holds(store, clock):
    batch = await running_batch(store, 5)
    first = await store.claim("a", 3, LEASE_S)
    assert [c.line for c in first] == [1, 2, 3]
    assert {c.batch_id for c in first} == {batch.id}
    assert first[0].principal == ACME and first[0].url == "/v1/chat/completions"
    second = await store.claim("b", 10, LEASE_S)
    assert [c.line for c in second] == [4, 5]  # the rest; a's are leased
    clock.advance(LEASE_S - 1)
    assert await store.claim("c", 10, LEASE_S) == []


async def test_an_expired_lease_is_claimed_again_and_a_renewed_one_is_not(store, clock):
    await running_batch(store, 2)
    crashed = await store.claim("crashed", 1, LEASE_S)
    alive = await store.claim("alive", 1, LEASE_S)
    clock.advance(LEASE_S * 2 / 3)
    assert await store.renew("alive", LEASE_S) == 1  # the heartbeat
    clock.advance(LEASE_S / 2)  # crashed's lease ran out; alive's was renewed
    taken = await store.claim("other", 10, LEASE_S)
    assert [c.line for c in taken] == [crashed[0].line]
    assert alive[0].line not in [c.line for c in taken]


async def test_a_finished_item_is_never_claimed_again(store, clock):
    batch = await running_batch(store, 3)
    claims = await store.claim("a", 3, LEASE_S)
    await finish_all(store, "a", claims[:2])
    clock.advance(LEASE_S * 10)  # every lease long gone
    again = await store.claim("b", 10, LEASE_S)
    assert [c.line for c in again] == [3]  # only the unfinished one
    found = await store.batch(ACME, batch.id)
    assert found is not None and found.request_counts.completed == 2


async def test_the_first_result_wins_when_a_lease_was_lost(store, clock):
    await running_batch(store, 1)
    (slow,) = await store.claim("slow", 1, LEASE_S)
    clock.advance(LEASE_S + 1)
    (taken,) = await store.claim("fast", 1, LEASE_S)
    written, settled = await store.finish("fast", taken, ok=True, result=line_for("r0"))
    assert (written, settled) == (True, True)
    late, _ = await store.finish("slow", slow, ok=True, result=line_for("r0"))
    assert late is False  # the item is done; the slow owner's answer is not written


async def test_retry_later_waits_for_its_time_and_counts_the_attempt(store, clock):
    await running_batch(store, 1)
    (item,) = await store.claim("a", 1, LEASE_S)
    assert await store.retry_later("a", item, 10.0)
    assert await store.claim("a", 1, LEASE_S) == []
    clock.advance(10.0)
    (again,) = await store.claim("b", 1, LEASE_S)
    assert again.attempts == 1


async def test_release_hands_every_held_item_back_at_once(store):
    await running_batch(store, 3)
    await store.claim("stopping", 3, LEASE_S)
    assert await store.release("stopping") == 3
    assert len(await store.claim("next", 10, LEASE_S)) == 3


async def test_two_stores_on_one_database_never_claim_the_same_item(jobs_at, clock):
    one = JobStore(jobs_at, clock, retention_s=RETENTION_S)
    two = JobStore(jobs_at, clock, retention_s=RETENTION_S)
    try:
        await running_batch(one, 200)
        rounds = await asyncio.gather(
            *(
                store.claim(name, 7, LEASE_S)
                for _ in range(20)
                for store, name in ((one, "one"), (two, "two"))
            )
        )
        claimed = [(c.batch_id, c.line) for batch in rounds for c in batch]
        assert len(claimed) == len(set(claimed)) == 200
    finally:
        await one.aclose()
        await two.aclose()


# ---------------------------------------------------------------- finishing a batch
async def test_finalize_writes_output_and_error_files_in_input_order(store):
    batch = await running_batch(store, 4)
    claims = await store.claim("a", 4, LEASE_S)
    for item in reversed(claims):  # finish out of order
        ok = item.line != 2
        line = line_for(item.custom_id, 200 if ok else 400)
        await store.finish("a", item, ok=ok, result=line)
    assert await store.settled() == [batch.id]
    assert await store.finalize(batch.id)
    assert await store.finalize(batch.id) is False  # a second replica finds it final
    final = await store.batch(ACME, batch.id)
    assert final is not None and final.status == "completed"
    assert final.completed_at is not None and final.finalizing_at is not None
    counts = final.request_counts
    assert (counts.total, counts.completed, counts.failed) == (4, 3, 1)
    assert final.output_file_id is not None and final.error_file_id is not None
    output = await store.content(ACME, final.output_file_id)
    errors = await store.content(ACME, final.error_file_id)
    assert output is not None and errors is not None
    assert [json.loads(x)["custom_id"] for x in output[1].splitlines()] == ["r0", "r2", "r3"]
    assert [json.loads(x)["custom_id"] for x in errors[1].splitlines()] == ["r1"]
    assert output[0].purpose == "batch_output"


async def test_cancel_drops_pending_items_and_lets_running_ones_finish(store):
    batch = await running_batch(store, 5)
    running = await store.claim("a", 2, LEASE_S)
    cancelling = await store.cancel(ACME, batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    assert await store.claim("b", 10, LEASE_S) == []  # a stopping batch gives no work
    assert await store.drop_stopped() == 3
    assert await store.settled() == []  # two still running
    await finish_all(store, "a", running)
    assert await store.settled() == [batch.id]
    await store.finalize(batch.id)
    final = await store.batch(ACME, batch.id)
    assert final is not None and final.status == "cancelled" and final.cancelled_at
    assert (final.request_counts.completed, final.request_counts.failed) == (2, 3)
    assert final.error_file_id is not None
    errors = await store.content(ACME, final.error_file_id)
    assert errors is not None
    codes = {json.loads(x)["error"]["code"] for x in errors[1].splitlines()}
    assert codes == {"batch_cancelled"}
    assert (await store.cancel(ACME, batch.id)).status == "cancelled"  # again: a no-op


async def test_cancelling_twice_is_a_no_op_and_an_ended_batch_is_a_conflict(store):
    batch = await running_batch(store, 1)
    await store.cancel(ACME, batch.id)
    assert (await store.cancel(ACME, batch.id)).status == "cancelling"
    assert await store.claim("a", 1, LEASE_S) == []
    other = await running_batch(store, 1)
    (item,) = await store.claim("a", 1, LEASE_S)
    await finish_all(store, "a", [item])
    await store.finalize(other.id)
    with pytest.raises(ConflictError):
        await store.cancel(ACME, other.id)


async def test_a_batch_cancelled_while_validating_never_starts(store):
    content = jsonl(2)
    file = await store.add_file(ACME, filename="f", purpose="batch", content=content)
    body = BatchCreate(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await store.create_batch(ACME, body, DAY)
    (pending,) = await store.validating(10)
    assert (await store.cancel(ACME, batch.id)).status == "cancelled"
    assert await store.start(pending, parse_jsonl(content)[0]) is False
    assert await store.claim("a", 10, LEASE_S) == []


async def test_past_the_completion_window_the_rest_expires(store, clock):
    batch = await running_batch(store, 4, window_s=3600)
    (done,) = await store.claim("a", 1, LEASE_S)
    await finish_all(store, "a", [done])
    clock.advance(3600 - 10)
    assert len(await store.claim("crashed", 1, LEASE_S)) == 1  # its runner dies now
    clock.advance(10)
    assert await store.expire_due() == 1
    assert await store.claim("b", 10, LEASE_S) == []
    assert await store.drop_stopped() == 2  # the two pending; the running lease holds
    clock.advance(LEASE_S)
    assert await store.drop_stopped() == 1  # the dead runner's item
    await store.finalize(batch.id)
    final = await store.batch(ACME, batch.id)
    assert final is not None and final.status == "expired" and final.expired_at
    assert (final.request_counts.completed, final.request_counts.failed) == (1, 3)
    errors = await store.content(ACME, final.error_file_id or "")
    assert errors is not None
    lines = [json.loads(x) for x in errors[1].splitlines()]
    assert [x["custom_id"] for x in lines] == ["r1", "r2", "r3"]
    assert all(x["response"] is None and x["error"]["code"] == "batch_expired" for x in lines)


async def test_a_batch_whose_input_is_invalid_fails_with_its_errors(store):
    file = await store.add_file(ACME, filename="f", purpose="batch", content=jsonl(1))
    body = BatchCreate(input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h")
    batch = await store.create_batch(ACME, body, DAY)
    error = BatchError(code="invalid_url", message="no", param="url", line=1)
    assert await store.fail(batch.id, [error])
    final = await store.batch(ACME, batch.id)
    assert final is not None and final.status == "failed" and final.failed_at
    assert final.errors is not None and final.errors.data == [error]


# ---------------------------------------------------------------- tenants
async def test_a_tenant_never_sees_another_tenants_files_or_batches(store):
    batch = await running_batch(store, 1, ACME)
    file_id = batch.input_file_id
    assert await store.file(GLOBEX, file_id) is None
    assert await store.content(GLOBEX, file_id) is None
    assert await store.delete_file(GLOBEX, file_id) is False
    assert await store.batch(GLOBEX, batch.id) is None
    assert (await store.files(GLOBEX)).data == []
    assert (await store.batches(GLOBEX)).data == []
    with pytest.raises(NotFoundError):
        await store.cancel(GLOBEX, batch.id)
    body = BatchCreate(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(NotFoundError):
        await store.create_batch(GLOBEX, body, DAY)
    with pytest.raises(UnknownCursor):
        await store.files(GLOBEX, after=file_id)
    assert await store.file(ACME, file_id) is not None  # still there for its owner


async def test_only_batch_files_can_start_a_batch(store):
    batch = await running_batch(store, 1)
    (item,) = await store.claim("a", 1, LEASE_S)
    await finish_all(store, "a", [item])
    await store.finalize(batch.id)
    final = await store.batch(ACME, batch.id)
    assert final is not None and final.output_file_id
    body = BatchCreate(
        input_file_id=final.output_file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(InvalidRequestError):
        await store.create_batch(ACME, body, DAY)


# ---------------------------------------------------------------- retention
async def test_expired_files_and_ended_batches_are_deleted(store, clock):
    batch = await running_batch(store, 1)
    (item,) = await store.claim("a", 1, LEASE_S)
    await finish_all(store, "a", [item])
    await store.finalize(batch.id)
    short = await store.add_file(
        ACME, filename="s", purpose="batch", content=b"x", expires_after_s=3600
    )
    clock.advance(3600)
    assert await store.file(ACME, short.id) is None  # gone for readers at once
    assert await store.sweep() == (1, 0)
    clock.advance(RETENTION_S)
    assert await store.sweep() == (2, 1)  # the input and output files, the batch
    assert await store.batch(ACME, batch.id) is None
    assert (await store.files(ACME)).data == []


# ---------------------------------------------------------------- pages
async def test_file_and_batch_lists_page_by_cursor(store):
    ids = [
        (await store.add_file(ACME, filename=f"f{i}", purpose="batch", content=b"x")).id
        for i in range(5)
    ]
    first = await store.files(ACME, limit=2)
    assert [f.id for f in first.data] == ids[::-1][:2]
    assert first.has_more and first.first_id == ids[4] and first.last_id == ids[3]
    rest = await store.files(ACME, after=first.last_id, limit=10)
    assert [f.id for f in rest.data] == ids[::-1][2:] and not rest.has_more
    oldest = await store.files(ACME, limit=2, order="asc")
    assert [f.id for f in oldest.data] == ids[:2]
    for _ in range(3):
        await running_batch(store, 1)
    page = await store.batches(ACME, limit=2)
    tail = await store.batches(ACME, after=page.last_id, limit=2)
    assert page.has_more and not tail.has_more
    assert len({b.id for b in page.data + tail.data}) == 3


async def test_metadata_and_output_expiry_are_kept(store, clock):
    file = await store.add_file(ACME, filename="f", purpose="batch", content=jsonl(1))
    body = msgspec.convert(
        {
            "input_file_id": file.id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"job": "nightly"},
            "output_expires_after": {"anchor": "created_at", "seconds": 7200},
        },
        BatchCreate,
    )
    batch = await store.create_batch(ACME, body, DAY)
    assert batch.metadata == {"job": "nightly"}
    assert batch.expires_at == batch.created_at + DAY
    (pending,) = await store.validating(10)
    await store.start(pending, parse_jsonl(jsonl(1))[0])
    (item,) = await store.claim("a", 1, LEASE_S)
    await finish_all(store, "a", [item])
    await store.finalize(batch.id)
    final = await store.batch(ACME, batch.id)
    assert final is not None
    output = await store.file(ACME, final.output_file_id or "")
    assert output is not None and output.expires_at == int(clock.wall()) + 7200
