"""A key's own limits (``Principal.limits``, set over the control plane) in the quota
manager, on the memory store and on a real Redis: they replace the tenant's
``key_limits`` for that key only, the tenant's ``limits`` still apply on top, they limit a
key whose tenant has no limits (or that the manager does not know), and they count on the
same counters as before, so a key whose limits change keeps what it used this window."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.clock import FakeClock
from core.config_tenants import Limits, RedisConfig, TenantConfig
from core.errors import RateLimitError
from core.tenancy import Principal
from policies.quotas import QuotaManager
from policies.quotas.checks import own_key_specs
from policies.quotas.windows import Window, seconds_left
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore

pytestmark = pytest.mark.anyio


def who(key: str = "k1", limits: Limits | None = None, tenant: str = "acme") -> Principal:
    return Principal(tenant=tenant, key_id=key, via="api_key", limits=limits)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def store(request, clock: FakeClock) -> AsyncIterator[MemoryStore | RedisStore]:
    if request.param == "memory":
        yield MemoryStore(clock)
        return
    url = request.getfixturevalue("redis_url")
    redis_store = RedisStore(RedisConfig(url=url, key_prefix="sy:", timeout_s=5), clock)
    yield redis_store
    await redis_store.aclose()


def quotas(store, clock: FakeClock, **tenants: TenantConfig) -> QuotaManager:
    return QuotaManager(tenants, store, MemoryStore(clock), clock)


async def admitted(q: QuotaManager, principal: Principal, n: int, prefix: str) -> int:
    """How many of ``n`` admissions succeed."""
    count = 0
    for i in range(n):
        try:
            await q.admit(principal, 0, 0.0, f"{prefix}{i}")
        except RateLimitError:
            continue
        count += 1
    return count


async def test_a_keys_own_rpm_replaces_the_tenants_key_limits(store, clock) -> None:
    q = quotas(store, clock, acme=TenantConfig(key_limits=Limits(rpm=5)))
    own = who("own", Limits(rpm=2))
    first = await q.admit(own, 0, 0.0, "a")
    assert first.headers()["x-ratelimit-limit-requests"] == "2"
    await q.admit(own, 0, 0.0, "b")
    with pytest.raises(RateLimitError) as info:
        await q.admit(own, 0, 0.0, "c")
    error = info.value
    assert "key 'own' of tenant 'acme': requests per minute limit (2)" in error.message
    assert error.headers["x-ratelimit-limit-requests"] == "2"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.retry_after == seconds_left(Window.MINUTE, clock.wall())
    assert await admitted(q, who("other"), 6, "o") == 5  # the tenant's key_limits still
    assert await admitted(q, who("higher", Limits(rpm=9)), 10, "h") == 9  # may exceed them
    assert await admitted(q, who("free", Limits()), 20, "f") == 20  # empty: unlimited


async def test_the_tenants_own_limits_still_apply_on_top(store, clock) -> None:
    q = quotas(store, clock, acme=TenantConfig(limits=Limits(rpm=3)))
    with pytest.raises(RateLimitError, match="tenant 'acme'"):
        for i in range(4):
            await q.admit(who("k", Limits(rpm=10)), 0, 0.0, f"r{i}")


async def test_a_tenant_without_limits_is_limited_through_its_keys_own(store, clock) -> None:
    q = quotas(store, clock, acme=TenantConfig())
    assert await admitted(q, who("own", Limits(rpm=2)), 4, "a") == 2
    assert await admitted(q, who("plain"), 4, "p") == 4
    # a tenant this manager does not know: only the key's own limits, never none
    assert await admitted(q, who("x", Limits(rpm=1), tenant="ghost"), 3, "g") == 1
    assert await admitted(q, who("y", tenant="ghost"), 3, "h") == 3
    bare = who("z", Limits(rpm=1), tenant="ghost")
    assert q.admits_without_io(bare) is isinstance(store, MemoryStore)
    assert q.admits_without_io(who("y", tenant="ghost")) is True


async def test_a_key_keeps_its_count_when_its_limits_change(store, clock) -> None:
    q = quotas(store, clock, acme=TenantConfig(key_limits=Limits(rpm=5)))
    assert await admitted(q, who("k"), 3, "a") == 3  # under the tenant's key_limits
    assert await admitted(q, who("k", Limits(rpm=4)), 3, "b") == 1  # own: 4 - 3 used
    assert await admitted(q, who("k", Limits(rpm=6)), 3, "c") == 2  # raised: 6 - 4
    assert await admitted(q, who("k"), 3, "d") == 0  # back to key_limits: 6 used >= 5
    clock.advance(seconds_left(Window.MINUTE, clock.wall()))
    assert await admitted(q, who("k", Limits(rpm=4)), 5, "e") == 4  # a new minute


async def test_own_budget_and_concurrency(store, clock) -> None:
    q = quotas(store, clock, acme=TenantConfig(key_limits=Limits(usd_per_day=100)))
    own = who("k", Limits(usd_per_day=0.3, concurrency=1))
    first = await q.admit(own, 0, 0.2, "a")
    with pytest.raises(RateLimitError, match="concurrent requests"):
        await q.admit(own, 0, 0.0, "b")
    await q.settle(first, 0, 0.25)  # the lease is released; 0.25 spent
    with pytest.raises(RateLimitError) as info:
        await q.admit(own, 0, 0.1, "c")
    assert info.value.code == "insufficient_quota"
    assert info.value.retry_after == seconds_left(Window.DAY, clock.wall())
    await q.settle(await q.admit(own, 0, 0.05, "d"), 0, 0.05)
    await q.admit(who("k2"), 0, 50.0, "e")  # another key: the tenant's key_limits


async def test_current_shows_the_keys_own_limits(store, clock) -> None:
    q = quotas(store, clock, acme=TenantConfig(limits=Limits(rpm=50), key_limits=Limits(rpm=5)))
    await q.admit(who("k", Limits(rpm=2, tpm=100)), 30, 0.0, "a")
    use = await q.current("acme", "k", Limits(rpm=2, tpm=100))
    assert use == [
        {"scope": "tenant", "metric": "requests", "limit": 50.0, "used": 1.0},
        {"scope": "key", "metric": "requests", "limit": 2.0, "used": 1.0},
        {"scope": "key", "metric": "tokens", "limit": 100.0, "used": 30.0},
    ]
    tenants = await q.current("acme", "k")  # without the key's limits: the tenant's
    assert [(u["scope"], u["limit"], u["used"]) for u in tenants] == [
        ("tenant", 50.0, 1.0),
        ("key", 5.0, 1.0),
    ]


def test_own_specs_are_computed_once_per_distinct_limits() -> None:
    first = own_key_specs(Limits(rpm=7, usd_per_month=3))
    assert own_key_specs(Limits(rpm=7, usd_per_month=3)) is first
    assert [(s.metric, s.scope, s.limit) for s in first] == [
        ("requests", "key", 7),
        ("usd_month", "key", 3),
    ]
    assert own_key_specs(Limits()) == ()
