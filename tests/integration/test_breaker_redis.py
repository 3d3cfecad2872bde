"""Shared circuit breakers on a real redis-server: two SharedBreakers instances with their
own RedisStore (as two gateway replicas would have) on one Redis; the Lua scripts against
their Python twins; Redis stopping mid-run."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_routing import BreakerConfig
from core.config_tenants import RedisConfig
from policies.breaker.scripts import PROBE, READ, RECORD, config_args, parse_fields, record_args
from policies.breaker.shared import SharedBreakers
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.anyio

CONFIG = BreakerConfig(
    failure_rate=0.5,
    window_s=10.0,
    min_calls=4,
    consecutive_failures=3,
    cooldown_s=5.0,
    half_open_probes=1,
)


def redis_store(url: str, clock: FakeClock) -> RedisStore:
    return RedisStore(
        RedisConfig(url=url, key_prefix="bt:", timeout_s=0.5, retry_interval_s=1.0), clock
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def replicas(
    redis_url: str, clock: FakeClock
) -> AsyncIterator[tuple[SharedBreakers, SharedBreakers]]:
    stores = [redis_store(redis_url, clock), redis_store(redis_url, clock)]
    a, b = (SharedBreakers(CONFIG, s, clock) for s in stores)
    a.track(["oa/gpt"])
    b.track(["oa/gpt"])
    yield a, b
    for breakers, store in zip((a, b), stores, strict=True):
        await breakers.aclose()
        await store.aclose()


async def test_failures_recorded_by_one_replica_open_the_breaker_for_the_other(replicas):
    a, b = replicas
    for _ in range(3):
        a.attempt_finished("oa/gpt", error="UpstreamServerError", ttft_s=None, retryable=False)
    await a.flush()
    assert a.state("oa/gpt") == "open"
    assert b.state("oa/gpt") == "closed"  # b answers from its snapshot until it refreshes
    await b.refresh()
    assert b.state("oa/gpt") == "open"
    assert await b.admit("oa/gpt") == "circuit open"


async def test_failures_split_across_replicas_add_up(replicas):
    """Two failures on a and one on b: three in a row in the shared hash."""
    a, b = replicas
    a.record("oa/gpt", "UpstreamTimeoutError")
    a.record("oa/gpt", "UpstreamTimeoutError")
    await a.flush()
    b.record("oa/gpt", "UpstreamConnectError")
    await b.flush()
    assert b.state("oa/gpt") == "open"  # b's write answered with the shared state
    await a.refresh()
    assert a.state("oa/gpt") == "open"


async def test_probe_limit_holds_across_both_replicas(replicas, clock):
    a, b = replicas
    for _ in range(3):
        a.record("oa/gpt", "UpstreamServerError")
    await a.flush()
    await b.refresh()
    clock.advance(CONFIG.cooldown_s)
    assert a.state("oa/gpt") == b.state("oa/gpt") == "half_open"
    tries = await asyncio.gather(*(r.try_probe("oa/gpt") for r in (a, b, a, b, a, b)))
    assert sorted(tries) == [False] * 5 + [True]  # one probe, however the race goes
    prober = a if any(tries[0::2]) else b
    other = b if prober is a else a
    prober.attempt_finished("oa/gpt", error=None, ttft_s=0.3, retryable=False)
    await prober.flush()
    await other.refresh()
    assert other.state("oa/gpt") == "closed"
    assert await other.admit("oa/gpt") is True


async def test_failed_probe_reopens_for_everyone(replicas, clock):
    a, b = replicas
    for _ in range(3):
        b.record("oa/gpt", "UpstreamServerError")
    await b.flush()
    await a.refresh()
    clock.advance(CONFIG.cooldown_s)
    assert await a.admit("oa/gpt") is True
    a.record("oa/gpt", "UpstreamTimeoutError")
    await a.flush()
    await b.refresh()
    assert b.state("oa/gpt") == "open"
    clock.advance(CONFIG.cooldown_s - 0.1)
    assert b.state("oa/gpt") == "open"  # a fresh cool-down from the failed probe


async def test_background_refresh_shares_state_within_a_few_intervals(redis_url, clock):
    stores = [redis_store(redis_url, clock), redis_store(redis_url, clock)]
    a = SharedBreakers(CONFIG, stores[0], clock)
    b = SharedBreakers(CONFIG, stores[1], clock, refresh_s=0.01)
    b.track(["oa/gpt"])
    await b.start()
    try:
        for _ in range(3):
            a.record("oa/gpt", "UpstreamServerError")
        await a.flush()
        for _ in range(300):
            if b.state("oa/gpt") == "open":
                break
            await asyncio.sleep(0.01)
        assert b.state("oa/gpt") == "open"
    finally:
        await b.aclose()
        await a.aclose()
        for store in stores:
            await store.aclose()


async def test_redis_stopping_mid_run_falls_back_to_local_state(
    redis_server: RedisServer, redis_url, clock, replicas
):
    a, b = replicas
    a.record("oa/gpt", "UpstreamServerError")
    await a.flush()
    redis_server.stop()
    try:
        a.record("oa/gpt", "UpstreamServerError")
        a.record("oa/gpt", "UpstreamServerError")
        await a.flush()
        assert a.store_down
        assert a.state("oa/gpt") == "open"  # the local machine counted all three
        await b.refresh()
        assert b.store_down and b.state("oa/gpt") == "closed"  # local fallback is local
        clock.advance(CONFIG.cooldown_s)
        assert await a.try_probe("oa/gpt") is True  # a local probe slot
        assert await a.try_probe("oa/gpt") is False
    finally:
        redis_server.start()
    clock.advance(1.0)  # past the store's fail-fast interval
    await a.refresh()
    assert not a.store_down
    # the shared hash saw one failure only: closed again, one failure in the window
    assert a.state("oa/gpt") == "closed"


OPS = st.lists(
    st.tuples(
        st.sampled_from(["probe"])
        | st.lists(st.sampled_from(["success", "failure", "neutral"]), min_size=1, max_size=3),
        st.sampled_from([0.0, 0.0, 0.0, 0.25, 1.0, 2.5, 6.0]),
    ),
    max_size=40,
)
_keys = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(OPS, st.integers(1, 3))
@example([([op], 0.0) for op in ("success", "failure", "success", "failure")], 1)  # rate 0.5
@example(
    [(["failure"] * 5, 0.0)]
    + [("probe", 5.0)] * 3
    + [(["neutral"], 0.0), ("probe", 0.0), (["success", "failure"], 1.0)],
    2,
)
def test_lua_scripts_match_their_python_twins(redis_url, sequence, probes):
    """Every op sequence leaves the Redis hash and the memory store's copy equal (Lua
    prints numbers with 14 significant digits, hence approx)."""
    config = BreakerConfig(
        failure_rate=0.5,
        window_s=10.0,
        min_calls=4,
        consecutive_failures=5,
        cooldown_s=5.0,
        half_open_probes=probes,
    )
    key = f"twin:{next(_keys)}"

    async def scenario():
        clock = FakeClock()
        redis, memory = redis_store(redis_url, clock), MemoryStore(clock)
        try:
            for op, step in sequence:
                clock.advance(step)
                now = clock.wall()
                if op == "probe":
                    args = [now, *config_args(config, 60.0)]
                    got = [await s.run(PROBE, [key], args) for s in (redis, memory)]
                    assert int(got[0][0]) == int(got[1][0])
                    got = [g[1:] for g in got]
                else:
                    args = record_args(now, op, config, 60.0)
                    got = [await s.run(RECORD, [key], args) for s in (redis, memory)]
                assert parse_fields(got[0]) == pytest.approx(parse_fields(got[1]), rel=1e-12)
            (from_redis,), (from_memory,) = [await s.run(READ, [key], []) for s in (redis, memory)]
            assert parse_fields(from_redis) == pytest.approx(parse_fields(from_memory), rel=1e-12)
        finally:
            await redis.aclose()

    anyio.run(scenario)
