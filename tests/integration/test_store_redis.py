"""RedisStore against a real redis-server: prefixes, TTLs, EVALSHA with NOSCRIPT reload,
the same Script on both backends, and outage handling (fail fast, automatic recovery)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from core.clock import FakeClock
from core.config import ConfigError
from core.config_tenants import RedisConfig
from policies.store.base import Script, StoreUnavailableError
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.anyio

INCR_LUA = """
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return {v, ARGV[3]}
"""


def _incr(data, keys, args, now):
    value = int(data.get(keys[0]) or 0) + int(args[0])
    fresh = data.get(keys[0]) is None
    data.set(keys[0], value)
    if fresh:
        data.expire(keys[0], int(args[1]) / 1000)
    return [value, str(args[2]).encode()]


INCR = Script("incr", INCR_LUA, _incr)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def rstore(redis_url: str, clock: FakeClock) -> AsyncIterator[RedisStore]:
    # 5 s, not 0.5: on a loaded 2-core CI machine a connect took longer than 0.5 s once
    # (test_script_reloads_after_noscript); the outage tests here see refused
    # connections, which fail at once whatever the timeout.
    store = RedisStore(RedisConfig(url=redis_url, key_prefix="t:", timeout_s=5.0), clock)
    yield store
    await store.aclose()


@pytest.fixture(params=["memory", "redis"])
async def store(request, clock: FakeClock) -> AsyncIterator[MemoryStore | RedisStore]:
    if request.param == "memory":
        yield MemoryStore(clock)
        return
    url = request.getfixturevalue("redis_url")
    redis_store = RedisStore(RedisConfig(url=url, key_prefix="t:"), clock)
    yield redis_store
    await redis_store.aclose()


async def test_same_script_same_answers_on_both_backends(store) -> None:
    now = store.now()
    assert await store.run(INCR, ["n"], [2, 60_000, now]) == [2, repr(now).encode()]
    assert (await store.run(INCR, ["n"], [5, 60_000, now]))[0] == 7
    assert await store.get("n") == b"7"
    await store.delete("n")
    assert await store.get("n") is None


async def test_keys_carry_the_prefix_and_ttls(rstore: RedisStore) -> None:
    await rstore.set("a", b"v", ttl_s=30)
    assert rstore.key("a") == "t:a"
    assert await rstore.client.get("t:a") == b"v"
    assert await rstore.client.get("a") is None
    assert 29_000 < await rstore.client.pttl("t:a") <= 30_000
    await rstore.set("a", b"w")
    assert await rstore.client.pttl("t:a") == -1  # a plain set drops the TTL, as in memory
    await rstore.run(INCR, ["n"], [1, 5_000, 0])
    assert 0 < await rstore.client.pttl("t:n") <= 5_000


async def test_script_reloads_after_noscript(rstore: RedisStore) -> None:
    assert (await rstore.run(INCR, ["n"], [1, 60_000, 0]))[0] == 1
    await rstore.client.script_flush()
    assert (await rstore.run(INCR, ["n"], [1, 60_000, 0]))[0] == 2


async def test_script_errors_are_not_outages(rstore: RedisStore) -> None:
    broken = Script("broken", "return redis.call('NOPE')", lambda *a: None)
    with pytest.raises(Exception) as info:
        await rstore.run(broken, ["x"], [])
    assert not isinstance(info.value, StoreUnavailableError)
    assert rstore.available and await rstore.get("x") is None


async def test_outage_fails_fast_then_recovers_without_reset(
    redis_server: RedisServer, rstore: RedisStore, clock: FakeClock
) -> None:
    await rstore.set("a", b"1")
    redis_server.stop()
    try:
        with pytest.raises(StoreUnavailableError):
            await rstore.get("a")
        assert not rstore.available and rstore.failures == 1
    finally:
        redis_server.start()
    # Redis is back, but the store stays on fail-fast until retry_interval_s has passed:
    # the call must not even try the network (no new failure is counted).
    with pytest.raises(StoreUnavailableError):
        await rstore.run(INCR, ["n"], [1, 60_000, 0])
    assert rstore.failures == 1
    clock.advance(rstore.config.retry_interval_s)
    assert (await rstore.run(INCR, ["n"], [1, 60_000, 0]))[0] == 1  # NOSCRIPT reload too
    assert rstore.available


async def test_a_silent_server_counts_as_unavailable(clock: FakeClock) -> None:
    # Accepts TCP connections (kernel backlog) but never answers: a command must time out.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        store = RedisStore(RedisConfig(url=f"redis://127.0.0.1:{port}/0", timeout_s=0.2), clock)
        with pytest.raises(StoreUnavailableError):
            await store.get("a")
        await store.aclose()


async def test_refused_connection_is_unavailable(clock: FakeClock) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = RedisStore(RedisConfig(url=f"redis://127.0.0.1:{port}/0"), clock)
    for _ in range(2):
        with pytest.raises(StoreUnavailableError):
            await store.set("a", b"1")
    assert store.failures == 1  # the second call failed fast
    await store.aclose()


async def test_a_read_only_replica_counts_as_unavailable(
    rstore: RedisStore, clock: FakeClock
) -> None:
    # What a client sees while talking to a demoted primary during a failover.
    await rstore.client.execute_command("REPLICAOF", "127.0.0.1", "1")
    try:
        with pytest.raises(StoreUnavailableError):
            await rstore.set("a", b"1")
    finally:
        await rstore.client.execute_command("REPLICAOF", "NO", "ONE")
    clock.advance(rstore.config.retry_interval_s)
    await rstore.set("a", b"1")
    assert await rstore.get("a") == b"1"


async def test_the_url_may_come_from_the_environment(redis_url: str, clock: FakeClock) -> None:
    config = RedisConfig(url="redis://127.0.0.1:1/0", url_env="SY_REDIS_URL", key_prefix="t:")
    store = RedisStore(config, clock, env={"SY_REDIS_URL": redis_url})
    try:
        await store.set("from-env", b"1")
        assert await store.get("from-env") == b"1"  # reached the real server, not port 1
    finally:
        await store.aclose()


def test_a_missing_url_variable_is_a_config_error_naming_it(clock: FakeClock) -> None:
    config = RedisConfig(url_env="SY_REDIS_URL")
    with pytest.raises(
        ConfigError, match=r"state\.redis\.url_env: environment variable SY_REDIS_URL"
    ):
        RedisStore(config, clock, env={})
