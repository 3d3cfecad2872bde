"""Shared target load on a real redis-server: two ``SharedTargetLoad`` replicas with their
own ``RedisStore`` on one Redis; the SYNC Lua script against its Python twin; Redis
stopping mid-run."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_tenants import RedisConfig
from policies.load_shared import SYNC, SharedTargetLoad, sync_args
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.anyio

LABEL = "oa/gpt"
PREFIX = "lt:"


def redis_store(url: str, clock: FakeClock) -> RedisStore:
    return RedisStore(
        RedisConfig(url=url, key_prefix=PREFIX, timeout_s=0.5, retry_interval_s=1.0), clock
    )


async def redis_hash(store: RedisStore, key: str) -> dict[str, str]:
    raw = await store.client.hgetall(store.key(key))
    return {k.decode(): v.decode() for k, v in raw.items()}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def stores(redis_url: str, clock: FakeClock) -> AsyncIterator[list[RedisStore]]:
    stores = [redis_store(redis_url, clock), redis_store(redis_url, clock)]
    yield stores
    for store in stores:
        await store.aclose()


@pytest.fixture
def replicas(stores, clock) -> tuple[SharedTargetLoad, SharedTargetLoad]:
    a = SharedTargetLoad(stores[0], clock, "a")
    b = SharedTargetLoad(stores[1], clock, "b")
    b.track([LABEL])
    return a, b


async def test_counts_add_up_across_replicas(replicas, stores):
    a, b = replicas
    for _ in range(3):
        a.enter(LABEL)
    b.enter(LABEL)
    await a.sync()
    await b.sync()
    await a.sync()
    assert a.count(LABEL) == b.count(LABEL) == 4
    assert a.others(LABEL) == 1 and b.others(LABEL) == 3
    assert set(await redis_hash(stores[0], SharedTargetLoad.key(LABEL))) == {"a", "b"}
    ttl_ms = await stores[0].client.pttl(PREFIX + "load:" + LABEL)
    assert 0 < ttl_ms <= 5000  # a dead replica's key goes away by itself


async def test_leaving_publishes_the_zero(replicas, stores):
    a, b = replicas
    a.enter(LABEL)
    await a.sync()
    await b.sync()
    assert b.count(LABEL) == 1
    a.leave(LABEL)
    await a.sync()
    assert await stores[0].client.exists(PREFIX + "load:" + LABEL) == 0
    await b.sync()
    assert b.count(LABEL) == 0


async def test_a_silent_replicas_entries_stop_counting_after_ttl(replicas, stores, clock):
    a, b = replicas
    a.enter(LABEL)
    a.enter(LABEL)
    b.enter(LABEL)
    await a.sync()
    clock.advance(4.9)
    await b.sync()
    assert b.count(LABEL) == 3
    clock.advance(0.2)
    await b.sync()
    assert b.count(LABEL) == 1
    assert set(await redis_hash(stores[1], SharedTargetLoad.key(LABEL))) == {"b"}
    await a.sync()
    await b.sync()
    assert b.count(LABEL) == 3


async def test_background_loops_share_counts(stores, clock):
    a = SharedTargetLoad(stores[0], clock, "a", publish_every_s=0.01)
    b = SharedTargetLoad(stores[1], clock, "b", publish_every_s=0.01)
    b.track([LABEL])
    await a.start()
    await b.start()
    try:
        a.enter(LABEL)
        a.enter(LABEL)
        for _ in range(300):
            if b.count(LABEL) == 2:
                break
            await asyncio.sleep(0.01)
        assert b.count(LABEL) == 2
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_stopping_mid_run_degrades_to_local_counts(
    redis_server: RedisServer, replicas, clock
):
    a, b = replicas
    a.enter(LABEL)
    a.enter(LABEL)
    b.enter(LABEL)
    await a.sync()
    await b.sync()
    assert b.count(LABEL) == 3
    redis_server.stop()
    try:
        await b.sync()
        assert b.store_down and b.count(LABEL) == 1  # local only
        b.leave(LABEL)
        await b.sync()  # fails fast: the zero waits for the store
        assert b.count(LABEL) == 0
    finally:
        redis_server.start()  # an empty Redis (no persistence)
    clock.advance(1.0)  # past the store's fail-fast interval
    await b.sync()  # republishes the zero (nothing to delete in the fresh Redis)
    assert not b.store_down and b.count(LABEL) == 0
    clock.advance(1.0)
    await a.sync()  # a republishes what it holds
    await b.sync()
    assert b.count(LABEL) == 2


# The Lua script against its Python twin: random sequences of syncs by three replicas over
# two keys, at times that cross the ttl, both backends must answer and store the same.
REPLICAS = ("a", "b", "c")
KEYS = ("k1", "k2")
COUNT = st.none() | st.integers(0, 3)
OPS = st.lists(
    st.tuples(
        st.sampled_from(REPLICAS),
        st.tuples(COUNT, COUNT),
        st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.0]),
    ),
    max_size=30,
)
_runs = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(OPS)
@example([("a", (2, None), 0.0), ("b", (1, 1), 3.0), ("a", (None, None), 2.5)])
@example([("a", (2, 2), 0.0), ("a", (0, None), 1.0), ("b", (None, 3), 0.0)])
def test_lua_script_matches_its_python_twin(redis_url, sequence):
    ttl = 3.0

    async def scenario():
        clock = FakeClock()
        redis, memory = redis_store(redis_url, clock), MemoryStore(clock)
        keys = [f"twin:{next(_runs)}:{k}" for k in KEYS]
        try:
            for who, published, step in sequence:
                clock.advance(step)
                for key in keys:  # Redis' TTLs run on real time: expire what the fake clock did
                    if memory.data.get(key) is None:
                        await redis.client.delete(redis.key(key))
                args = sync_args(clock.wall(), ttl, who, list(published))
                got = [await s.run(SYNC, keys, args) for s in (redis, memory)]
                assert got[0] == got[1]
                for key in keys:
                    from_memory = dict(memory.data.get(key) or {})
                    assert await redis_hash(redis, key) == from_memory
                    # only whether the key has a TTL compares (real time vs the fake clock)
                    has_ttl = await redis.client.pttl(redis.key(key)) > 0
                    assert has_ttl == (memory.data.ttl(key) is not None)
        finally:
            await redis.aclose()

    anyio.run(scenario)
