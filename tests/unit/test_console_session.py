"""Console sessions (gateway/console/session.py) on both shared-store backends: a login's
session reads back, ends at its time to live and at logout, junk and unknown ids read as
none, the store never sees the session id itself, and an unreachable Redis is reported as
``StoreUnavailableError`` (the console answers 503)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest

from core.clock import FakeClock
from core.config_tenants import RedisConfig
from gateway.console.session import SessionStore, credential_digest, new_token
from policies.store import MemoryStore, RedisStore
from policies.store.base import Store, StoreUnavailableError
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Store, FakeClock]]:
    clock = FakeClock()
    if request.param == "memory":
        yield MemoryStore(clock), clock
        return
    url = request.getfixturevalue("redis_url")
    redis = RedisStore(RedisConfig(url=url, key_prefix="t:", timeout_s=0.5), clock)
    try:
        yield redis, clock
    finally:
        await redis.aclose()


async def test_a_session_reads_back_until_its_time_to_live(store: tuple[Store, FakeClock]) -> None:
    backend, clock = store
    sessions = SessionStore(backend, clock, ttl_s=600.0)
    session_id, session = await sessions.create("tenant_admin", "acme", "k1", "sy-k1-secret")
    assert session.credential_sha256 == hashlib.sha256(b"sy-k1-secret").hexdigest()
    assert session.expires == session.created + 600.0 and len(session.csrf) >= 43
    assert await sessions.load(session_id) == session
    clock.advance(599.0)
    assert await sessions.load(session_id) == session
    clock.advance(1.0)
    assert await sessions.load(session_id) is None


async def test_logout_deletes_the_session(store: tuple[Store, FakeClock]) -> None:
    backend, clock = store
    sessions = SessionStore(backend, clock)
    session_id, _ = await sessions.create("admin", None, None, "admin-key")
    await sessions.delete(session_id)
    assert await sessions.load(session_id) is None


async def test_unknown_and_junk_ids_read_as_no_session(store: tuple[Store, FakeClock]) -> None:
    backend, clock = store
    sessions = SessionStore(backend, clock)
    await sessions.create("admin", None, None, "admin-key")
    for junk in [None, "", "x", "a" * 44, "../../etc", "é" * 43, new_token()]:
        assert await sessions.load(junk) is None
    await sessions.delete("not-an-id")  # a no-op, never an error


async def test_the_store_keeps_a_hash_of_the_id_never_the_id(
    store: tuple[Store, FakeClock],
) -> None:
    backend, clock = store
    sessions = SessionStore(backend, clock)
    session_id, _ = await sessions.create("admin", None, None, "admin-key")
    hashed = "console:session:" + hashlib.sha256(session_id.encode()).hexdigest()
    assert await backend.get(hashed) is not None
    assert await backend.get("console:session:" + session_id) is None
    assert b"admin-key" not in (await backend.get(hashed) or b"")


async def test_a_corrupt_record_reads_as_no_session(store: tuple[Store, FakeClock]) -> None:
    backend, clock = store
    sessions = SessionStore(backend, clock)
    session_id, _ = await sessions.create("admin", None, None, "admin-key")
    hashed = "console:session:" + hashlib.sha256(session_id.encode()).hexdigest()
    await backend.set(hashed, b'{"role": "root"}')
    assert await sessions.load(session_id) is None


async def test_an_unreachable_redis_raises_store_unavailable(
    redis_server: RedisServer, redis_url: str
) -> None:
    clock = FakeClock()
    redis = RedisStore(RedisConfig(url=redis_url, key_prefix="t:", timeout_s=0.5), clock)
    sessions = SessionStore(redis, clock)
    session_id, _ = await sessions.create("admin", None, None, "admin-key")
    redis_server.stop()
    try:
        with pytest.raises(StoreUnavailableError):
            await sessions.load(session_id)
        with pytest.raises(StoreUnavailableError):
            await sessions.create("admin", None, None, "admin-key")
    finally:
        redis_server.start()
        await redis.aclose()


def test_credential_digests_are_sha256_hex() -> None:
    assert credential_digest("abc") == hashlib.sha256(b"abc").hexdigest()
    assert new_token() != new_token()
