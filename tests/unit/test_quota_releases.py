"""Concurrency leases outlive neither a failed settle nor a timed-out admission: they are
queued in ``PendingReleases`` and released once the store answers again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from core.clock import FakeClock
from core.config_tenants import Limits, TenantConfig
from core.errors import ServiceUnavailableError
from core.tenancy import Principal
from policies.quotas import QuotaManager
from policies.quotas.releases import PendingReleases
from policies.store.base import Script, StoreUnavailableError, Value
from policies.store.memory import MemoryStore

pytestmark = pytest.mark.anyio
ACME = Principal(tenant="acme", key_id="k1", via="api_key")


class FlakyStore(MemoryStore):
    """A memory store that refuses scripts while ``down``; with ``lands_anyway`` a refused
    script still runs (a reply lost after the store applied it)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.down = False
        self.lands_anyway = False

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Value]) -> Any:
        if self.down:
            if self.lands_anyway:
                await super().run(script, keys, args)
            raise StoreUnavailableError("down")
        return await super().run(script, keys, args)


def quotas(store: FlakyStore, clock: FakeClock, on_failure: str = "open") -> QuotaManager:
    tenant = TenantConfig(limits=Limits(concurrency=2), on_store_failure=on_failure)
    return QuotaManager({"acme": tenant}, store, MemoryStore(clock), clock)


async def leases(q: QuotaManager) -> float:
    return {e["metric"]: e["used"] for e in await q.current("acme")}["concurrency"]


async def test_a_settle_in_an_outage_releases_the_lease_when_the_store_is_back() -> None:
    clock = FakeClock()
    store = FlakyStore(clock)
    q = quotas(store, clock)
    admission = await q.admit(ACME, 10, 0.0, "r1")
    store.down = True
    await q.settle(admission, 10, 0.0)  # never raises
    assert len(q.releases) == 1
    assert await q.releases.retry() == 0  # still down: kept
    store.down = False
    assert await leases(q) == 1
    assert await q.releases.retry() == 1
    assert await leases(q) == 0 and len(q.releases) == 0
    assert await q.releases.retry() == 0  # idempotent, nothing left


async def test_a_timed_out_admission_that_landed_is_released_too() -> None:
    clock = FakeClock()
    store = FlakyStore(clock)
    q = quotas(store, clock, on_failure="closed")
    store.down = store.lands_anyway = True
    with pytest.raises(ServiceUnavailableError):
        await q.admit(ACME, 10, 0.0, "r1")
    store.down = False
    assert await leases(q) == 1  # the store applied what the client never heard back from
    await q.releases.retry()
    assert await leases(q) == 0
    # Both slots are free again: two requests at once are admitted.
    await q.admit(ACME, 10, 0.0, "r2")
    await q.admit(ACME, 10, 0.0, "r3")
    assert await leases(q) == 2


def test_pending_releases_are_bounded_oldest_dropped_first() -> None:
    store = MemoryStore(FakeClock())
    pending = PendingReleases(limit=2)
    for rid in ("a", "b", "c"):
        pending.add(store, rid, ["quota:{acme}:t:concurrency"])
    pending.add(store, "no-lease", [])  # nothing to release: not kept
    assert len(pending) == 2 and pending.dropped == 1
