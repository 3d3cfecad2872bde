"""Shared target load on the memory store: two ``SharedTargetLoad`` replicas on one
``MemoryStore`` (the SYNC script's Python twin) see each other's counts after a sync; entries
expire after ttl_s on the fake clock; a store outage degrades to local counts."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from core.clock import FakeClock
from policies.load_shared import SYNC, SharedTargetLoad, default_replica_id, sync_args
from policies.store.base import StoreUnavailableError
from policies.store.memory import MemoryStore

pytestmark = pytest.mark.anyio

LABEL = "oa/gpt"
KEY = SharedTargetLoad.key(LABEL)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock)


def replica(store, clock, name: str, **kwargs) -> SharedTargetLoad:
    return SharedTargetLoad(store, clock, name, **kwargs)


class DownStore(MemoryStore):
    """A memory store that is unreachable while ``down`` is set."""

    def __init__(self, clock):
        super().__init__(clock)
        self.down = False
        self.calls = 0

    async def run(self, script, keys, args):
        self.calls += 1
        if self.down:
            raise StoreUnavailableError("connection refused")
        return await super().run(script, keys, args)


async def test_local_enter_and_leave_are_immediate_without_any_sync(store, clock):
    load = replica(store, clock, "a")
    assert load.enter(LABEL) == 0
    assert load.enter(LABEL) == 1
    assert load.count(LABEL) == 2
    load.leave(LABEL)
    assert load.count(LABEL) == 1
    load.leave(LABEL)
    load.leave(LABEL)  # one too many: stays at zero
    assert load.count(LABEL) == 0
    assert store.data.get(KEY) is None  # nothing went to the store


async def test_counts_add_up_across_replicas_after_a_sync(store, clock):
    a, b = replica(store, clock, "a"), replica(store, clock, "b")
    for _ in range(3):
        a.enter(LABEL)
    for _ in range(2):
        b.enter(LABEL)
    assert a.count(LABEL) == 3 and b.count(LABEL) == 2  # nothing shared yet
    await a.sync()  # a publishes 3, sees nothing from b yet
    assert a.count(LABEL) == 3
    await b.sync()  # b publishes 2, reads a's 3
    assert b.count(LABEL) == 5 and b.others(LABEL) == 3 and b.local_count(LABEL) == 2
    await a.sync()
    assert a.count(LABEL) == 5
    assert a.enter(LABEL) == 5  # the count before, across replicas (the load curve's input)
    assert a.count(LABEL) == 6  # the local part moves at once


async def test_a_replica_reads_labels_it_only_tracks(store, clock):
    a, b = replica(store, clock, "a"), replica(store, clock, "b")
    b.track([LABEL, "other/m"])
    a.enter(LABEL)
    await a.sync()
    await b.sync()
    assert b.count(LABEL) == 1 and b.count("other/m") == 0
    assert store.data.get(KEY) == {"a": f"1 {clock.wall()!r}"}  # b published nothing


async def test_leaving_publishes_the_zero_once(store, clock):
    a, b = replica(store, clock, "a"), replica(store, clock, "b")
    b.track([LABEL])
    a.enter(LABEL)
    a.enter(LABEL)
    await a.sync()
    await b.sync()
    assert b.count(LABEL) == 2
    a.leave(LABEL)
    a.leave(LABEL)
    await a.sync()  # the zero: a's field is deleted
    assert store.data.get(KEY) is None
    await b.sync()
    assert b.count(LABEL) == 0
    # an idle label is read but no longer published
    await a.sync()
    assert store.data.get(KEY) is None


async def test_published_arguments_cover_held_and_recently_left_labels_only():
    class Recording(MemoryStore):
        def __init__(self, clock):
            super().__init__(clock)
            self.args: list = []

        async def run(self, script, keys, args):
            self.args.append((list(keys), list(args[3:])))
            return await super().run(script, keys, args)

    clock = FakeClock()
    store = Recording(clock)
    load = replica(store, clock, "a")
    load.track(["x/1", "x/2"])
    load.enter("x/1")
    load.enter("x/3")
    load.leave("x/3")
    await load.sync()
    await load.sync()
    assert store.args == [
        (["load:x/1", "load:x/2", "load:x/3"], ["1", "-", "0"]),
        (["load:x/1", "load:x/2", "load:x/3"], ["1", "-", "-"]),
    ]


async def test_a_silent_replicas_entries_expire_after_ttl(store, clock):
    a = replica(store, clock, "a", ttl_s=5.0)
    b = replica(store, clock, "b", ttl_s=5.0)
    a.enter(LABEL)
    a.enter(LABEL)
    b.enter(LABEL)
    await a.sync()
    clock.advance(4.9)
    await b.sync()  # b's publish keeps the key alive past a's ttl
    assert b.count(LABEL) == 3  # a's entry is still fresh
    clock.advance(0.2)  # 5.1 s after a's last publish: a looks dead
    await b.sync()
    assert b.count(LABEL) == 1
    assert set(store.data.get(KEY)) == {"b"}  # b pruned a's stale field
    await a.sync()  # a is alive after all: it republishes what it holds
    await b.sync()
    assert b.count(LABEL) == 3


async def test_the_key_expires_ttl_after_the_last_publish(store, clock):
    a = replica(store, clock, "a", ttl_s=5.0)
    a.enter(LABEL)
    await a.sync()
    assert store.data.ttl(KEY) == pytest.approx(5.0)
    clock.advance(5.0)
    assert store.data.get(KEY) is None


async def test_a_stale_view_of_the_others_is_dropped_without_a_sync(store, clock):
    a = replica(store, clock, "a", ttl_s=5.0)
    b = replica(store, clock, "b", ttl_s=5.0)
    a.enter(LABEL)
    b.enter(LABEL)
    await a.sync()
    await b.sync()
    assert b.count(LABEL) == 2
    clock.advance(5.1)  # b's loop stalled: what it knows of a is too old to use
    assert b.count(LABEL) == 1


async def test_store_outage_degrades_to_local_counts_and_recovers(clock):
    store = DownStore(clock)
    a, b = replica(store, clock, "a"), replica(store, clock, "b")
    a.enter(LABEL)
    a.enter(LABEL)
    b.enter(LABEL)
    await a.sync()
    await b.sync()
    assert b.count(LABEL) == 3
    with capture_logs() as logs:
        store.down = True
        await b.sync()
        assert b.store_down and b.store_failures == 1
        assert b.count(LABEL) == 1  # local only
        b.leave(LABEL)  # the zero cannot be published now...
        await b.sync()
        assert b.store_failures == 2
        assert b.count(LABEL) == 0 and b.enter(LABEL) == 0
        b.leave(LABEL)
        assert store.data.get(KEY) == {"a": f"2 {clock.wall()!r}", "b": f"1 {clock.wall()!r}"}
        store.down = False
        await b.sync()  # ...so it goes out once the store is back
    assert not b.store_down
    assert b.count(LABEL) == 2  # a's again
    assert store.data.get(KEY) == {"a": f"2 {clock.wall()!r}"}
    events = [entry["event"] for entry in logs]
    assert events == ["load.store_unavailable", "load.store_recovered"]  # once each
    assert logs[0]["log_level"] == "warning" and logs[0]["fallback"] == "local"


async def test_never_reaching_the_store_means_local_only(clock):
    store = DownStore(clock)
    store.down = True
    load = replica(store, clock, "a")
    load.enter(LABEL)
    await load.sync()
    assert load.store_down and load.count(LABEL) == 1 and load.others(LABEL) == 0


async def test_nothing_known_means_no_store_call(clock):
    store = DownStore(clock)
    await replica(store, clock, "a").sync()
    assert store.calls == 0


async def test_background_loop_shares_counts_and_close_publishes_zeros(store, clock):
    a = replica(store, clock, "a", publish_every_s=0.001)
    b = replica(store, clock, "b", publish_every_s=0.001)
    b.track([LABEL])
    await a.start()
    await b.start()
    try:
        a.enter(LABEL)
        for _ in range(500):
            if b.count(LABEL) == 1:
                break
            await asyncio.sleep(0.001)
        assert b.count(LABEL) == 1
        a.leave(LABEL)
        await a.aclose()  # the last publish sends the zero
        assert store.data.get(KEY) is None
        for _ in range(500):
            if b.count(LABEL) == 0:
                break
            await asyncio.sleep(0.001)
        assert b.count(LABEL) == 0
    finally:
        await a.aclose()
        await b.aclose()


async def test_twin_sums_only_other_fresh_entries_and_prunes_the_rest(store, clock):
    now = clock.wall()
    store.data.set(
        KEY,
        {
            "me": "7 1.0",  # our own old entry: replaced, never counted
            "fresh": f"3 {now - 1.0!r}",
            "stale": f"4 {now - 5.0!r}",
            "garbage": "not a count",
        },
    )
    answer = await store.run(SYNC, [KEY], sync_args(now, 5.0, "me", [2]))
    assert answer == [3]
    assert store.data.get(KEY) == {"me": f"2 {now!r}", "fresh": f"3 {now - 1.0!r}"}


def test_constructor_validates_its_arguments(store, clock):
    with pytest.raises(ValueError):
        SharedTargetLoad(store, clock, "a", publish_every_s=0)
    with pytest.raises(ValueError):
        SharedTargetLoad(store, clock, "a", ttl_s=-1)
    with pytest.raises(ValueError):
        SharedTargetLoad(store, clock, "a b")
    assert default_replica_id() != default_replica_id()
    assert " " not in default_replica_id()


class KeyLog(MemoryStore):
    """A memory store that remembers the keys each script read."""

    def __init__(self, clock):
        super().__init__(clock)
        self.keys: list[list[str]] = []

    async def run(self, script, keys, args):
        self.keys.append(list(keys))
        return await super().run(script, keys, args)


async def test_track_replaces_the_labels_read_but_keeps_those_still_held(clock):
    store = KeyLog(clock)
    load = replica(store, clock, "a")
    load.track([LABEL, "gone/m"])
    load.enter("gone/m")  # a call still running on a replica that discovery removed
    load.track([LABEL])
    await load.sync()
    assert set(store.keys[-1]) == {SharedTargetLoad.key(LABEL), SharedTargetLoad.key("gone/m")}
    load.leave("gone/m")
    load.track([LABEL])
    await load.sync()  # publishes gone/m's zero once
    assert SharedTargetLoad.key("gone/m") in store.keys[-1]
    load.track([LABEL])
    await load.sync()
    assert store.keys[-1] == [SharedTargetLoad.key(LABEL)]  # no longer read
