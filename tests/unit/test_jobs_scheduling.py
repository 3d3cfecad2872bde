"""Batch scheduling and accounting in the job store (on SQLite and Postgres) and the
runner's pure parts: tenants take turns at claims, an item's usage adds to its batch's
``usage`` and its alias becomes the batch's ``model``, an older store file (SQLite) gains
the new columns, and the local-only part of a completion window."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from core.protocols import Timeouts
from core.routing import RouteRequest
from gateway.request.batch import BatchCaller, batch_route, local_first
from policies.jobs import JobStore
from policies.jobs.usage import ItemUsage, item_usage, requested_model
from routers.targets import Target
from tests.unit.test_jobs_store import (
    ACME,
    GLOBEX,
    LEASE_S,
    clock,
    jobs_at,
    line_for,
    running_batch,
    store,
)

pytestmark = pytest.mark.anyio
ADDED = ("model", "input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")
__all__ = ["clock", "jobs_at", "store"]  # fixtures (the store's: on SQLite and Postgres)


async def test_tenants_take_turns_whatever_the_size_of_their_batches(store) -> None:
    big = await running_batch(store, 50, ACME)
    small = await running_batch(store, 3, GLOBEX)  # created after the big one
    taken = await store.claim("a", 6, LEASE_S)
    assert [c.batch_id for c in taken].count(small.id) == 3
    assert [c.batch_id for c in taken].count(big.id) == 3
    rest = await store.claim("a", 100, LEASE_S)
    assert {c.batch_id for c in rest} == {big.id} and len(rest) == 47


async def test_within_a_tenant_the_oldest_batch_goes_first(store) -> None:
    first = await running_batch(store, 2, ACME)
    await running_batch(store, 2, ACME)
    taken = await store.claim("a", 2, LEASE_S)
    assert [(c.batch_id, c.line) for c in taken] == [(first.id, 1), (first.id, 2)]


async def test_claims_carry_the_batch_window(store, clock) -> None:
    batch = await running_batch(store, 1, window_s=3600)
    (item,) = await store.claim("a", 1, LEASE_S)
    assert item.created_at == batch.created_at and item.expires_at == batch.created_at + 3600


async def test_answered_usage_adds_up_and_the_alias_names_the_batch(store) -> None:
    batch = await running_batch(store, 3)
    one, two, three = await store.claim("a", 3, LEASE_S)
    await store.finish(
        "a", one, ok=True, result=line_for("r0"), usage=ItemUsage(10, 4, 5, 1), model="chat"
    )
    await store.finish(
        "a", two, ok=True, result=line_for("r1"), usage=ItemUsage(7, 0, 3, 0), model="other"
    )
    await store.finish("a", three, ok=False, result=line_for("r2", 400))  # no usage
    found = await store.batch(ACME, batch.id)
    assert found is not None and found.model == "chat"
    usage = found.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (17, 8, 25)
    assert usage.input_tokens_details.cached_tokens == 4
    assert usage.output_tokens_details.reasoning_tokens == 1


async def test_a_late_finish_of_a_lost_lease_adds_no_usage(store, clock) -> None:
    batch = await running_batch(store, 1)
    (slow,) = await store.claim("slow", 1, LEASE_S)
    clock.advance(LEASE_S + 1)
    (fast,) = await store.claim("fast", 1, LEASE_S)
    await store.finish("fast", fast, ok=True, result=line_for("r0"), usage=ItemUsage(5, 0, 5, 0))
    await store.finish("slow", slow, ok=True, result=line_for("r0"), usage=ItemUsage(9, 0, 9, 0))
    found = await store.batch(ACME, batch.id)
    assert found is not None and found.usage is not None and found.usage.total_tokens == 10


async def test_an_older_store_file_gains_the_usage_columns(tmp_path: Path, clock) -> None:
    path = tmp_path / "jobs.sqlite3"
    jobs = JobStore(path, clock, retention_s=60.0)
    await jobs.open()
    batch = await running_batch(jobs, 1)
    await jobs.aclose()
    old = sqlite3.connect(path)  # the file as the first release wrote it
    for column in ADDED:
        old.execute(f"ALTER TABLE batches DROP COLUMN {column}")
    old.commit()
    old.close()
    jobs = JobStore(path, clock, retention_s=60.0)
    await jobs.open()
    found = await jobs.batch(ACME, batch.id)
    await jobs.aclose()
    assert found is not None and found.usage is not None and found.usage.total_tokens == 0


# ---------------------------------------------------------------- an answer's usage
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"usage": {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details":'
            b' {"cached_tokens": 8}, "completion_tokens_details": {"reasoning_tokens": 2}}}',
            ItemUsage(12, 8, 5, 2),
        ),
        (
            b'{"usage": {"input_tokens": 9, "output_tokens": 4, "input_tokens_details":'
            b' {"cached_tokens": 1}, "output_tokens_details": {"reasoning_tokens": 3}}}',
            ItemUsage(9, 1, 4, 3),
        ),
        (b'{"usage": {"prompt_tokens": 6, "total_tokens": 6}}', ItemUsage(6, 0, 0, 0)),
        (b'{"error": {"message": "no"}}', ItemUsage()),
        (b'{"usage": {"prompt_tokens": -4, "completion_tokens": true}}', ItemUsage()),
        (b'{"usage": [1, 2]}', ItemUsage()),
        (b"not json", ItemUsage()),
    ],
)
def test_item_usage_reads_every_endpoints_usage(body: bytes, expected: ItemUsage) -> None:
    assert item_usage(body) == expected


def test_requested_model_is_the_bodys_alias_or_none() -> None:
    assert requested_model(b'{"model": "chat", "messages": []}') == "chat"
    assert requested_model(b'{"model": ""}') is None
    assert requested_model(b'{"model": 3}') is None
    assert requested_model(b"[") is None


# ---------------------------------------------------------------- the local-only share
@given(
    st.floats(0, 1e9),
    st.floats(1, 1e6),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_local_first_holds_for_exactly_the_first_share_of_the_window(
    created: float, window: float, share: float, at: float
) -> None:
    now = created + window * at
    boundary = created + window * share
    # Within rounding of the boundary the window the function sees, (created + window) -
    # created, is not ``window`` to the last bit (Hypothesis found 134217728.13 both ways).
    assume(abs(now - boundary) > 1e-9 * (created + window))
    assert local_first(created, created + window, now, share) == (now < boundary)


def test_local_first_ends_at_once_with_share_zero_and_never_with_share_one() -> None:
    assert not local_first(100.0, 200.0, 100.0, 0.0)
    assert local_first(100.0, 200.0, 199.9, 1.0)


def _target(label: str, local: bool) -> Target:
    return Target(
        alias="a",
        provider_name=label,
        model="m",
        provider=None,  # type: ignore[arg-type]  # routing views never call it
        timeouts=Timeouts(),
        local=local,
    )


def test_batch_route_keeps_an_item_local_only_while_the_alias_has_a_local_target() -> None:
    route = RouteRequest(model="a", prompt_tokens=1)
    mixed = [_target("cloud", False), _target("box", True)]
    caller = BatchCaller(ACME, "batch_1", local_first=True)
    assert batch_route(route, caller, mixed).local_only
    assert not batch_route(route, caller, mixed[:1]).local_only  # nothing local: unchanged
    assert not batch_route(route, caller._replace(local_first=False), mixed).local_only
    assert not batch_route(route, None, mixed).local_only  # not a batch item
