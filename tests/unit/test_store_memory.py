"""MemoryStore: values, TTLs on the injected clock (lazy expiry), and scripts' Python twins."""

from __future__ import annotations

import pytest

from core.clock import FakeClock
from policies.store.base import Script
from policies.store.memory import MemoryStore

pytestmark = pytest.mark.anyio


def _incr(data, keys, args, now):
    value = int(data.get(keys[0]) or 0) + int(args[0])
    data.set(keys[0], value)
    if data.ttl(keys[0]) is None:
        data.expire(keys[0], float(args[1]))
    return [value, repr(now).encode()]


INCR = Script("incr", "unused by the memory backend", _incr)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock)


async def test_set_get_delete(store: MemoryStore) -> None:
    assert await store.get("a") is None
    await store.set("a", b"1")
    assert await store.get("a") == b"1"
    await store.delete("a")
    assert await store.get("a") is None
    await store.delete("a")  # deleting a missing key is fine


async def test_ttl_expires_on_the_injected_clock(store: MemoryStore, clock: FakeClock) -> None:
    await store.set("a", b"x", ttl_s=10)
    clock.advance(9.9)
    assert await store.get("a") == b"x"
    clock.advance(0.1)
    assert await store.get("a") is None


async def test_set_without_ttl_clears_an_old_ttl(store: MemoryStore, clock: FakeClock) -> None:
    await store.set("a", b"x", ttl_s=1)
    await store.set("a", b"y")
    clock.advance(100)
    assert await store.get("a") == b"y"


async def test_now_is_the_wall_clock(store: MemoryStore, clock: FakeClock) -> None:
    assert store.now() == clock.wall()
    clock.advance(5)
    assert store.now() == clock.wall()


async def test_script_twin_gets_data_keys_args_and_now(
    store: MemoryStore, clock: FakeClock
) -> None:
    assert await store.run(INCR, ["n"], [2, 10]) == [2, repr(clock.wall()).encode()]
    assert (await store.run(INCR, ["n"], [3, 10]))[0] == 5
    assert await store.get("n") == b"5"  # numbers read back as Redis would return them
    clock.advance(10)  # the TTL set by the first call, not extended by the second
    assert (await store.run(INCR, ["n"], [1, 10]))[0] == 1


async def test_structured_values_are_not_strings(store: MemoryStore) -> None:
    await store.run(Script("h", "", lambda d, k, a, n: d.set(k[0], {"f": 1})), ["h"], [])
    with pytest.raises(TypeError):
        await store.get("h")


async def test_expire_zero_deletes_and_sweep_drops_expired(
    store: MemoryStore, clock: FakeClock
) -> None:
    data = store.data
    data.set("a", 1)
    data.expire("a", 0)
    assert data.get("a") is None
    data.set("b", 1)
    data.expire("b", 5)
    data.set("c", 1)
    assert data.ttl("b") == 5 and data.ttl("c") is None
    clock.advance(5)
    assert data.sweep() == 1
    assert len(data) == 1


async def test_writes_sweep_untouched_expired_keys(clock: FakeClock) -> None:
    store = MemoryStore(clock, sweep_every=10)
    for i in range(5):
        await store.set(f"k{i}", b"x", ttl_s=1)
    clock.advance(2)
    for i in range(5):
        await store.set(f"live{i}", b"x")
    assert set(store.data._values) == {f"live{i}" for i in range(5)}
