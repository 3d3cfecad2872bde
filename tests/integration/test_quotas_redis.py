"""Quotas on a real Redis: the same scenarios on both backends (Lua and Python twins agree),
TTLs on every counter, three OS processes racing for one tenant's RPM, and Redis stopped
mid-run and restarted (fail open on local limits / fail closed with 503, then back)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.clock import FakeClock
from core.config_tenants import Limits, RedisConfig, TenantConfig
from core.errors import RateLimitError, ServiceUnavailableError
from core.tenancy import Principal
from policies.quotas import QuotaManager
from policies.quotas.windows import Window, seconds_left
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


def who(tenant: str = "acme", key: str = "k1") -> Principal:
    return Principal(tenant=tenant, key_id=key, via="api_key")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def store(request, clock: FakeClock) -> AsyncIterator[MemoryStore | RedisStore]:
    if request.param == "memory":
        yield MemoryStore(clock)
        return
    url = request.getfixturevalue("redis_url")
    redis_store = RedisStore(RedisConfig(url=url, key_prefix="sy:"), clock)
    yield redis_store
    await redis_store.aclose()


def quotas(store, clock: FakeClock, **tenants: TenantConfig) -> QuotaManager:
    return QuotaManager(tenants, store, MemoryStore(clock), clock)


# -- the same behaviour on both backends ----------------------------------------------------


async def test_rpm_tpm_headers_and_reconcile(store, clock: FakeClock) -> None:
    q = quotas(store, clock, acme=TenantConfig(limits=Limits(rpm=3, tpm=1000)))
    a = await q.admit(who(), 700, 0.0, "a")
    assert a.headers() == {
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "40s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "300",
        "x-ratelimit-reset-tokens": "40s",
    }
    with pytest.raises(RateLimitError) as info:
        await q.admit(who(), 301, 0.0, "b")
    assert info.value.retry_after == 40.0
    assert info.value.headers["x-ratelimit-remaining-tokens"] == "300"
    await q.settle(a, 200, 0.0)
    await q.settle(a, 200, 0.0)  # idempotent
    b = await q.admit(who(), 800, 0.0, "b")
    assert b.headers()["x-ratelimit-remaining-tokens"] == "0"
    assert b.headers()["x-ratelimit-remaining-requests"] == "1"
    clock.advance(40)
    await q.settle(b, 900, 0.0)  # 100 over, settled in the next minute: debt
    c = await q.admit(who(), 0, 0.0, "c")
    assert c.headers()["x-ratelimit-remaining-tokens"] == "900"
    assert c.headers()["x-ratelimit-remaining-requests"] == "2"


async def test_concurrency_and_key_scope(store, clock: FakeClock) -> None:
    cfg = TenantConfig(limits=Limits(concurrency=3), key_limits=Limits(concurrency=2))
    q = quotas(store, clock, acme=cfg)
    a1 = await q.admit(who(key="a"), 0, 0.0, "a1")
    await q.admit(who(key="a"), 0, 0.0, "a2")
    with pytest.raises(RateLimitError, match="key 'a'"):
        await q.admit(who(key="a"), 0, 0.0, "a3")
    await q.admit(who(key="b"), 0, 0.0, "b1")
    with pytest.raises(RateLimitError, match="tenant 'acme': concurrent"):
        await q.admit(who(key="c"), 0, 0.0, "c1")
    await q.settle(a1, 0, 0.0)
    await q.settle(a1, 0, 0.0)
    await q.admit(who(key="c"), 0, 0.0, "c1")
    clock.advance(q.lease_s)  # every lease lapses (a replica crashed holding them)
    for rid in ("x1", "x2"):
        await q.admit(who(key="x"), 0, 0.0, rid)


async def test_spend_in_floats(store, clock: FakeClock) -> None:
    q = quotas(store, clock, acme=TenantConfig(limits=Limits(usd_per_day=0.3, usd_per_month=10)))
    first = await q.admit(who(), 0, 0.1, "a")
    await q.admit(who(), 0, 0.2, "b")  # 0.1 + 0.2 fits 0.3 despite binary floats
    with pytest.raises(RateLimitError) as info:
        await q.admit(who(), 0, 0.001, "c")
    assert info.value.code == "insufficient_quota"
    assert info.value.retry_after == seconds_left(Window.DAY, clock.wall())
    await q.settle(first, 0, 0.0499)
    await q.admit(who(), 0, 0.05, "c")
    with pytest.raises(RateLimitError):
        await q.admit(who(), 0, 0.001, "d")


async def test_every_redis_counter_expires(redis_url: str, clock: FakeClock) -> None:
    store = RedisStore(RedisConfig(url=redis_url, key_prefix="sy:"), clock)
    limits = Limits(rpm=9, tpm=9000, concurrency=9, usd_per_day=9, usd_per_month=9)
    q = quotas(store, clock, acme=TenantConfig(limits=limits, key_limits=limits))
    a = await q.admit(who(), 10, 0.01, "a")

    async def expiring() -> dict[str, int]:
        keys = [k.decode() async for k in store.client.scan_iter("*")]
        assert all(k.startswith("sy:quota:{acme}:") for k in keys)
        ttls = {
            k.rsplit(":", 1)[0] if k[-1].isdigit() else k: await store.client.pttl(k) for k in keys
        }
        month_ms = (seconds_left(Window.MONTH, clock.wall()) + 61) * 1000
        assert all(0 < ttl <= month_ms for ttl in ttls.values()), ttls
        return ttls

    ttls = await expiring()
    assert len(ttls) == 10  # 5 limits x (tenant, key)
    assert 0 < ttls["sy:quota:{acme}:t:concurrency"] <= q.lease_s * 1000
    assert 0 < ttls["sy:quota:{acme}:k:k1:requests"] <= 101_000  # 40 s left + 60 s slack
    clock.advance(60)
    await q.settle(a, 20, 0.02)  # debt written to a new minute's key; leases released
    keys = [k.decode() async for k in store.client.scan_iter("*")]
    assert len(keys) == 10 and not any(k.endswith("concurrency") for k in keys)
    assert len([k for k in keys if ":tokens:" in k]) == 4
    await expiring()
    await store.aclose()


# -- three replicas, one Redis --------------------------------------------------------------

REPLICA = r"""
import asyncio, json, sys
from core.clock import FakeClock
from core.config_tenants import Limits, RedisConfig, TenantConfig
from core.errors import RateLimitError
from core.tenancy import Principal
from policies.quotas import QuotaManager
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore

async def main(url, rpm, burst, replica):
    clock = FakeClock()  # frozen: every replica in the same minute, whatever the real time
    store = RedisStore(RedisConfig(url=url, timeout_s=5), clock)
    q = QuotaManager({"acme": TenantConfig(limits=Limits(rpm=rpm))}, store, MemoryStore(clock), clock)
    await store.client.ping()
    print("ready", flush=True)
    sys.stdin.readline()
    who = Principal(tenant="acme", key_id="k", via="api_key")
    async def one(i):
        try:
            a = await q.admit(who, 10, 0.0, f"{replica}-{i}")
            return "degraded" if a.degraded else "admitted"
        except RateLimitError:
            return "limited"
    results = await asyncio.gather(*(one(i) for i in range(burst)))
    print(json.dumps({r: results.count(r) for r in set(results)}), flush=True)
    await store.aclose()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
"""


def test_three_processes_admit_exactly_the_rpm(redis_url: str) -> None:
    rpm = 60
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REPLICA, redis_url, str(rpm), str(rpm), str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for n in range(3)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # release all three bursts together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        totals: Counter[str] = Counter()
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            totals.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert totals == {"admitted": rpm, "limited": 2 * rpm}


# -- Redis stopped mid-run, then restarted ------------------------------------------------------


async def _load(
    q: QuotaManager, tenant: str, log: list[tuple[str, str]], stop: asyncio.Event
) -> None:
    """Admit and settle in a loop, recording what each admission turned into."""
    i = 0
    while not stop.is_set():
        i += 1
        try:
            a = await q.admit(who(tenant), 5, 0.0, f"{tenant}-{i}")
            log.append((tenant, "degraded" if a.degraded else "redis"))
            await q.settle(a, 5, 0.0)
        except RateLimitError:
            log.append((tenant, "limited"))
        except ServiceUnavailableError:
            log.append((tenant, "503"))
        except Exception as exc:  # anything else is a failure of the contract
            log.append((tenant, f"unexpected {exc!r}"))
        await asyncio.sleep(0)


async def _until(predicate, what: str) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def test_redis_outage_mid_run(
    redis_server: RedisServer, redis_url: str, clock: FakeClock
) -> None:
    store = RedisStore(RedisConfig(url=redis_url, timeout_s=0.5, retry_interval_s=5), clock)
    tenants = {
        "open": TenantConfig(limits=Limits(rpm=100_000, concurrency=50)),
        "closed": TenantConfig(limits=Limits(rpm=100_000), on_store_failure="closed"),
    }
    q = QuotaManager(tenants, store, MemoryStore(clock), clock)
    log: list[tuple[str, str]] = []
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_load(q, t, log, stop)) for t in ("open", "closed", "open")]

    def seen(tenant: str, outcome: str, since: int = 0) -> bool:
        return (tenant, outcome) in log[since:]

    try:
        await _until(lambda: seen("open", "redis") and seen("closed", "redis"), "redis decisions")
        redis_server.stop()
        mark = len(log)
        await _until(
            lambda: seen("open", "degraded", mark) and seen("closed", "503", mark), "fallback"
        )
        assert not seen("closed", "degraded") and not seen("open", "503")
        redis_server.start()
        mark = len(log)
        clock.advance(5)  # retry_interval_s: the store tries Redis again by itself
        await _until(
            lambda: seen("open", "redis", mark) and seen("closed", "redis", mark), "recovery"
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await store.aclose()
    assert {outcome for _, outcome in log} <= {"redis", "degraded", "503"}, Counter(log)
    assert q.degraded_admissions > 0 and q.unavailable_rejections > 0
    assert await store.client.exists("switchyard:quota:{open}:t:concurrency") == 0  # all released


async def test_outage_keeps_local_limits_then_returns_to_shared_counts(
    redis_server: RedisServer, redis_url: str, clock: FakeClock
) -> None:
    store = RedisStore(RedisConfig(url=redis_url, retry_interval_s=2), clock)
    tenants = {
        "open": TenantConfig(limits=Limits(rpm=3, concurrency=5)),
        "closed": TenantConfig(limits=Limits(rpm=3), on_store_failure="closed"),
    }
    q = QuotaManager(tenants, store, MemoryStore(clock), clock)
    before = await q.admit(who("open"), 0, 0.0, "before")
    await q.admit(who("closed"), 0, 0.0, "c0")
    redis_server.stop()
    try:
        await q.settle(before, 0, 0.0)  # lost with Redis: logged, not raised
        assert q.settle_failures == 1
        local = [await q.admit(who("open"), 0, 0.0, f"o{i}") for i in range(3)]
        assert all(a.degraded for a in local)
        with pytest.raises(RateLimitError):  # this replica's own RPM limit
            await q.admit(who("open"), 0, 0.0, "o3")
        with pytest.raises(ServiceUnavailableError):
            await q.admit(who("closed"), 0, 0.0, "c1")
    finally:
        redis_server.start()
    clock.advance(2)
    # Redis came back empty (no persistence): shared counting starts again from zero.
    back = [await q.admit(who("open"), 0, 0.0, f"r{i}") for i in range(3)]
    assert not any(a.degraded for a in back)
    assert back[-1].headers()["x-ratelimit-remaining-requests"] == "0"
    await q.admit(who("closed"), 0, 0.0, "c2")
    await store.aclose()
