"""Idempotency claims on both store backends: claim, wait, replay, release and expiry.

The memory store runs on a fake clock; Redis runs the Lua twins on a real ``redis-server``
(TTLs there are Redis' own, so expiry is waited for with a bounded poll). Waits
(``claim_or_wait``) run on the system clock with short deadlines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from core.clock import FakeClock, SystemClock
from core.config_tenants import RedisConfig
from core.tenancy import ADMIN, OPEN, Principal
from policies.idempotency import (
    MISMATCH,
    PENDING,
    Claimed,
    IdempotencyKeys,
    Replay,
    StoredAnswer,
    UnreadableRecordError,
    fingerprint,
    invalid_key,
    scope_of,
)
from policies.store.base import StoreUnavailableError
from policies.store.memory import MemoryStore
from policies.store.redis import RedisStore
from tests.fixtures.server import free_port

pytestmark = pytest.mark.anyio

KEY = IdempotencyKeys.key("t:acme", "retry-1")
FP = fingerprint("POST", "/v1/chat/completions", b"", b'{"model":"chat"}')
OTHER_FP = fingerprint("POST", "/v1/chat/completions", b"", b'{"model":"other"}')
# Bytes of every value, CR/LF and NULs included: stored and read back unchanged.
ANSWER = StoredAnswer(
    200,
    [(b"content-type", b"text/event-stream"), (b"x-request-id", b"abc")],
    bytes(range(256)) + b"data: [DONE]\n\n",
)


def store_of(kind: str, clock, request) -> MemoryStore | RedisStore:
    if kind == "memory":
        return MemoryStore(clock)
    url = request.getfixturevalue("redis_url")
    return RedisStore(RedisConfig(url=url, key_prefix="t:"), clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def store(request, clock: FakeClock) -> AsyncIterator[MemoryStore | RedisStore]:
    backend = store_of(request.param, clock, request)
    yield backend
    await backend.aclose()


@pytest.fixture(params=["memory", "redis"])
async def live_store(request) -> AsyncIterator[MemoryStore | RedisStore]:
    """A store on the system clock, for waits."""
    backend = store_of(request.param, SystemClock(), request)
    yield backend
    await backend.aclose()


async def lapse(store, clock: FakeClock, key: str, seconds: float) -> None:
    """Let ``seconds`` pass for ``key``: on the fake clock at once, on Redis by waiting
    (bounded) until the key is gone."""
    if isinstance(store, MemoryStore):
        clock.advance(seconds)
        return
    deadline = time.monotonic() + seconds + 5
    while await store.get(key) is not None:
        assert time.monotonic() < deadline, "the key did not expire"
        await asyncio.sleep(0.01)


async def claimed(keys: IdempotencyKeys, key: str = KEY, fp: str = FP) -> Claimed:
    outcome = await keys.claim(key, fp, 30)
    assert isinstance(outcome, Claimed)
    return outcome


# -- claims, answers, releases ------------------------------------------------------------


async def test_first_claim_wins_the_rest_see_it_running(store, clock) -> None:
    keys = IdempotencyKeys(store, clock)
    claim = await claimed(keys)
    assert claim.fingerprint == FP
    assert await keys.claim(KEY, FP, 30) is PENDING
    assert await keys.claim(KEY, OTHER_FP, 30) is MISMATCH
    # another scope's same key is another key
    assert isinstance(await keys.claim(IdempotencyKeys.key("t:globex", "retry-1"), FP, 30), Claimed)


async def test_a_completed_answer_is_replayed_byte_for_byte(store, clock) -> None:
    keys = IdempotencyKeys(store, clock)
    claim = await claimed(keys)
    assert await keys.complete(KEY, claim, ANSWER, ttl_s=60)
    outcome = await keys.claim(KEY, FP, 30)
    assert isinstance(outcome, Replay)
    assert outcome.answer == ANSWER
    assert await keys.claim(KEY, OTHER_FP, 30) is MISMATCH
    # a stored answer is final: neither its old owner nor anyone else replaces or frees it
    assert not await keys.complete(KEY, claim, StoredAnswer(201, [], b"x"), ttl_s=60)
    assert not await keys.release(KEY, claim)
    assert isinstance(await keys.claim(KEY, FP, 30), Replay)


async def test_release_frees_the_key_only_for_its_owner(store, clock) -> None:
    keys = IdempotencyKeys(store, clock)
    claim = await claimed(keys)
    stranger = Claimed("0" * 32, FP)
    assert not await keys.release(KEY, stranger)
    assert not await keys.complete(KEY, stranger, ANSWER, ttl_s=60)
    assert not await keys.renew(KEY, stranger, 30)
    assert await keys.claim(KEY, FP, 30) is PENDING
    assert await keys.release(KEY, claim)
    again = await claimed(keys)
    assert again.owner != claim.owner
    assert not await keys.renew(KEY, claim, 30)  # the old claim is gone for good


async def test_a_claim_lapses_unless_renewed(store, clock) -> None:
    keys = IdempotencyKeys(store, clock)
    if isinstance(store, MemoryStore):
        claim = await claimed(keys)
        clock.advance(20)
        assert await keys.renew(KEY, claim, 30)  # 30 s from now again
        clock.advance(20)
        assert await keys.claim(KEY, FP, 30) is PENDING  # would have lapsed without renewal
    await store.delete(KEY)
    claim = await keys.claim(KEY, FP, 0.05)
    assert isinstance(claim, Claimed)
    await lapse(store, clock, KEY, 0.05)
    successor = await claimed(keys)
    assert successor.owner != claim.owner
    assert not await keys.release(KEY, claim)  # the lapsed owner cannot free the successor's


async def test_a_lapsed_claims_owner_may_still_store_its_answer(store, clock) -> None:
    keys = IdempotencyKeys(store, clock)
    claim = await keys.claim(KEY, FP, 0.05)
    assert isinstance(claim, Claimed)
    await lapse(store, clock, KEY, 0.05)
    assert await keys.complete(KEY, claim, ANSWER, ttl_s=60)
    assert isinstance(await keys.claim(KEY, FP, 30), Replay)


async def test_stored_answers_expire(store, clock) -> None:
    keys = IdempotencyKeys(store, clock)
    claim = await claimed(keys)
    assert await keys.complete(KEY, claim, ANSWER, ttl_s=0.05)
    await lapse(store, clock, KEY, 0.05)
    assert isinstance(await keys.claim(KEY, OTHER_FP, 30), Claimed)  # a fresh key


async def test_an_unreadable_answer_reads_as_an_outage(store, clock) -> None:
    keys = IdempotencyKeys(store, clock)
    await store.set(KEY, b"D" + FP.encode() + b"\xc1 not msgpack")
    with pytest.raises(UnreadableRecordError):
        await keys.claim(KEY, FP, 30)


# -- waiting --------------------------------------------------------------------------------


async def test_a_waiter_replays_the_answer_when_the_run_ends(live_store) -> None:
    keys = IdempotencyKeys(live_store, SystemClock())
    claim = await claimed(keys)
    waiter = asyncio.create_task(keys.claim_or_wait(KEY, FP, 30, wait_s=10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    assert await keys.complete(KEY, claim, ANSWER, ttl_s=60)
    outcome = await asyncio.wait_for(waiter, 5)
    assert isinstance(outcome, Replay)
    assert outcome.answer == ANSWER


async def test_a_waiter_runs_the_request_itself_when_the_run_failed(live_store) -> None:
    keys = IdempotencyKeys(live_store, SystemClock())
    claim = await claimed(keys)
    waiters = [asyncio.create_task(keys.claim_or_wait(KEY, FP, 30, wait_s=10)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert await keys.release(KEY, claim)
    done, waiting = await asyncio.wait(waiters, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    (first,) = done  # one takes the key over, ...
    successor = first.result()
    assert isinstance(successor, Claimed) and successor.owner != claim.owner
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiting)  # ... the others wait for it in turn
    assert await keys.complete(KEY, successor, ANSWER, ttl_s=60)
    outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert all(isinstance(o, Replay) and o.answer == ANSWER for o in outcomes)


async def test_a_waiter_gives_up_at_its_deadline(live_store) -> None:
    keys = IdempotencyKeys(live_store, SystemClock())
    await claimed(keys)
    started = time.monotonic()
    assert await keys.claim_or_wait(KEY, FP, 30, wait_s=0.2) is PENDING
    assert 0.2 <= time.monotonic() - started < 2
    assert await keys.claim_or_wait(KEY, OTHER_FP, 30, wait_s=5) is MISMATCH  # at once


async def test_a_waiter_on_another_replica_polls(live_store, request) -> None:
    """Two ``IdempotencyKeys`` (two replicas) on one store: no local wake-up, polling."""
    first = IdempotencyKeys(live_store, SystemClock())
    second = IdempotencyKeys(live_store, SystemClock())
    claim = await claimed(first)
    waiter = asyncio.create_task(second.claim_or_wait(KEY, FP, 30, wait_s=10))
    await asyncio.sleep(0.05)
    assert await first.complete(KEY, claim, ANSWER, ttl_s=60)
    assert isinstance(await asyncio.wait_for(waiter, 5), Replay)


# -- outages and inputs ---------------------------------------------------------------------


async def test_outages_raise_on_claim_and_are_absorbed_afterwards(clock) -> None:
    down = RedisStore(RedisConfig(url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2), clock)
    keys = IdempotencyKeys(down, clock)
    with pytest.raises(StoreUnavailableError):
        await keys.claim_or_wait(KEY, FP, 30, wait_s=1)
    claim = Claimed("0" * 32, FP)
    assert not await keys.complete(KEY, claim, ANSWER, ttl_s=60)
    assert not await keys.release(KEY, claim)
    assert not await keys.renew(KEY, claim, 30)
    assert keys.errors == 3
    await down.aclose()


def test_keys_fingerprints_and_scopes() -> None:
    assert invalid_key("k-1") is None
    assert invalid_key("x" * 255) is None
    assert "longer than 255" in (invalid_key("x" * 256) or "")
    assert "control" in (invalid_key("a\tb") or "")
    assert "empty" in (invalid_key("") or "")
    long_key = IdempotencyKeys.key("t:acme", "ä" * 255)
    assert long_key.startswith("idempotency:t:acme:") and len(long_key) == 19 + 64
    assert fingerprint("POST", "/v1/a", b"", b"x") != fingerprint("POST", "/v1/b", b"", b"x")
    assert fingerprint("POST", "/v1/a", b"q", b"") != fingerprint("POST", "/v1/a", b"", b"q")
    assert scope_of(Principal(tenant="acme", key_id="k", via="api_key")) == "t:acme"
    assert (scope_of(ADMIN), scope_of(OPEN)) == ("admin", "open")
