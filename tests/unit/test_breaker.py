"""The circuit breaker: the pure state machine (transitions, windows, probes) and the
store-backed SharedBreakers on the memory store (snapshot, probes, store outages)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_routing import BreakerConfig
from policies.breaker.machine import (
    BreakerMachine,
    acquire_probe,
    classify,
    record,
    window_counts,
)
from policies.breaker.scripts import PROBE, READ, RECORD, config_args, parse_fields, record_args
from policies.breaker.shared import SharedBreakers
from policies.store.base import StoreUnavailableError
from policies.store.memory import MemoryStore

pytestmark = pytest.mark.anyio

CONFIG = BreakerConfig(
    failure_rate=0.5,
    window_s=10.0,
    min_calls=4,
    consecutive_failures=3,
    cooldown_s=5.0,
    half_open_probes=2,
)


def machine(config=CONFIG):
    return BreakerMachine(config)


def test_classify_counts_only_what_says_something_about_the_target():
    for error in (
        "UpstreamTimeoutError",
        "UpstreamConnectError",
        "UpstreamServerError",
        "UpstreamMalformedError",
        "UpstreamRateLimitedError",
        "UpstreamAuthError",
    ):
        assert classify(error) == "failure"
    assert classify(None) == "success"
    assert classify("UpstreamBadRequestError") == "success"  # the request was wrong
    assert classify("CancelledError") == "neutral"
    assert classify("ValueError") == "neutral"


def test_consecutive_failures_open_it():
    m = machine()
    now = 100.0
    assert m.record(now, "failure") == "closed"
    assert m.record(now, "failure") == "closed"
    assert m.record(now, "success") == "closed"  # the run is broken
    m.record(now, "failure")
    m.record(now, "failure")
    assert m.record(now, "failure") == "open"
    assert m.state(now + 4.9) == "open"
    assert not m.try_probe(now + 4.9)


def test_failure_rate_needs_min_calls():
    config = BreakerConfig(failure_rate=0.5, window_s=10, min_calls=4, consecutive_failures=100)
    m = machine(config)
    m.record(1.0, "failure")
    m.record(1.0, "success")
    assert m.record(1.0, "failure") == "closed"  # 2/3 failed, but only 3 calls
    assert m.record(1.0, "success") == "closed"  # 4 calls, but a success never opens it
    assert m.record(1.0, "failure") == "open"  # 3/5 >= 0.5 with 5 >= 4 calls


def test_failure_rate_below_the_threshold_stays_closed():
    config = BreakerConfig(failure_rate=0.5, window_s=10, min_calls=4, consecutive_failures=100)
    m = machine(config)
    for _ in range(10):
        m.record(1.0, "success")
        m.record(1.0, "success")
        assert m.record(1.0, "failure") == "closed"  # 1/3 < 0.5


def test_rolling_window_forgets_old_outcomes():
    config = BreakerConfig(failure_rate=0.5, window_s=10, min_calls=4, consecutive_failures=100)
    m = machine(config)
    for _ in range(3):
        m.record(0.0, "failure")
    assert window_counts(m.fields, config, 0.0) == (3, 3)
    assert window_counts(m.fields, config, 9.0) == (3, 3)  # still inside the window
    assert window_counts(m.fields, config, 10.0) == (0, 0)  # a full window later: gone
    # so one more failure after the window is 1 of 1 calls, below min_calls: closed
    assert m.record(10.5, "failure") == "closed"
    assert window_counts(m.fields, config, 10.5) == (1, 1)


def test_cooldown_then_half_open_with_a_probe_limit():
    m = machine()
    for _ in range(3):
        m.record(0.0, "failure")
    assert m.state(4.99) == "open"
    assert m.state(5.0) == "half_open"
    assert m.try_probe(5.0) and m.try_probe(5.1)
    assert not m.try_probe(5.2)  # two probes out, limit 2
    assert m.record(6.0, "neutral") == "half_open"  # a cancelled probe frees its slot
    assert m.try_probe(6.1)
    assert not m.try_probe(6.2)


def test_half_open_success_closes_and_failure_reopens_with_a_fresh_cooldown():
    m = machine()
    for _ in range(3):
        m.record(0.0, "failure")
    assert m.try_probe(5.0)
    assert m.record(5.5, "success") == "closed"
    assert window_counts(m.fields, CONFIG, 5.5) == (0, 0)  # a clean slate
    assert m.try_probe(5.6)  # closed admits without a slot

    for _ in range(3):
        m.record(6.0, "failure")
    assert m.try_probe(11.0)
    assert m.record(11.5, "failure") == "open"
    assert m.state(16.4) == "open"  # the cool-down restarted at 11.5
    assert m.state(16.5) == "half_open"


def test_late_outcomes_while_open_are_ignored():
    m = machine()
    for _ in range(3):
        m.record(0.0, "failure")
    assert m.record(1.0, "success") == "open"
    assert m.fields["t"] == 0.0


def test_lost_probes_are_handed_out_again_after_a_cooldown():
    config = BreakerConfig(consecutive_failures=1, cooldown_s=5.0, half_open_probes=1)
    m = machine(config)
    m.record(0.0, "failure")
    assert m.try_probe(5.0)
    assert not m.try_probe(9.9)
    assert m.try_probe(10.0)  # the first probe never reported back (its replica died)


ops = st.lists(
    st.tuples(st.sampled_from(["success", "failure", "neutral", "probe"]), st.floats(0, 3)),
    max_size=60,
)


@given(ops, st.integers(1, 3), st.integers(1, 4))
def test_breaker_invariants(sequence, probes, consecutive):
    """Probes out never exceed the limit; it opens only on a failure; every open lasts at
    least the cool-down before it admits anything."""
    config = BreakerConfig(
        failure_rate=0.5,
        window_s=10,
        min_calls=3,
        consecutive_failures=consecutive,
        cooldown_s=2.0,
        half_open_probes=probes,
    )
    m = machine(config)
    now = 0.0
    for op, step in sequence:
        now += step
        before = m.state(now)
        if op == "probe":
            admitted = m.try_probe(now)
            assert admitted == (before == "closed") or before == "half_open"
            if before == "open":
                assert not admitted
        else:
            after = m.record(now, op)
            if after == "open" and before != "open":
                assert op == "failure"
                assert m.fields["t"] == now
        assert m.fields.get("p", 0) <= probes
        if m.state(now) == "open":
            assert now - m.fields["t"] < config.cooldown_s


twin_ops = st.lists(
    st.tuples(
        st.sampled_from(["probe"])
        | st.lists(st.sampled_from(["success", "failure", "neutral"]), min_size=1, max_size=4),
        st.floats(0, 3),
    ),
    max_size=40,
)


@given(twin_ops)
def test_script_twins_apply_the_machine_rules(sequence):
    """The memory store's script twins (the Python halves of the Lua scripts) keep the same
    state as the machine itself; a RECORD batch applies its outcomes in order."""
    import anyio

    async def scenario():
        store = MemoryStore(FakeClock())
        m = machine()
        now = 0.0
        for op, step in sequence:
            now += step
            if op == "probe":
                answer = await store.run(PROBE, ["k"], [now, *config_args(CONFIG, 60.0)])
                assert (int(answer[0]) == 1) == acquire_probe(m.fields, CONFIG, now)
                assert parse_fields(answer[1:]) == m.fields
            else:
                answer = await store.run(RECORD, ["k"], record_args(now, op, CONFIG, 60.0))
                for outcome in op:
                    record(m.fields, CONFIG, now, outcome)
                assert parse_fields(answer) == m.fields
        (flat,) = await store.run(READ, ["k"], [])
        assert parse_fields(flat) == m.fields

    anyio.run(scenario)


# --- SharedBreakers on the memory store --------------------------------------------------


FAST = BreakerConfig(consecutive_failures=2, cooldown_s=5.0, half_open_probes=1)


async def test_outcomes_recorded_by_one_replica_reach_the_others_on_refresh():
    clock = FakeClock()
    store = MemoryStore(clock)
    a, b = SharedBreakers(FAST, store, clock), SharedBreakers(FAST, store, clock)
    assert b.state("x/m") == "closed"  # b now knows the label and refreshes it
    a.attempt_finished("x/m", error="UpstreamServerError", ttft_s=None, retryable=False)
    a.attempt_finished("x/m", error="UpstreamTimeoutError", ttft_s=None, retryable=False)
    assert a.state("x/m") == "open"  # at once, before the store answers
    await a.flush()
    assert b.state("x/m") == "closed"  # b reads its snapshot, no store round trip
    await b.refresh()
    assert b.state("x/m") == "open"
    assert await b.admit("x/m") == "circuit open"

    class Target:  # the executor hands its gate a routers.targets.Target
        label = "x/m"

    assert await b.gate(Target()) == "circuit open"


async def test_probe_limit_holds_across_replicas():
    clock = FakeClock()
    store = MemoryStore(clock)
    a, b = SharedBreakers(FAST, store, clock), SharedBreakers(FAST, store, clock)
    b.track(["x/m"])
    for _ in range(2):
        a.record("x/m", "UpstreamServerError")
    await a.flush()
    await b.refresh()
    clock.advance(5.0)
    assert a.state("x/m") == b.state("x/m") == "half_open"
    assert await a.admit("x/m") is True
    assert await b.admit("x/m") == "probe limit"
    assert not await a.try_probe("x/m")
    a.attempt_finished("x/m", error=None, ttft_s=0.2, retryable=False)
    await a.flush()
    await b.refresh()
    assert b.state("x/m") == "closed"
    assert await b.admit("x/m") is True


async def test_a_refresh_does_not_undo_a_write_in_flight():
    clock = FakeClock()
    store = MemoryStore(clock)
    a = SharedBreakers(FAST, store, clock)
    a.record("x/m", "UpstreamServerError")
    a.record("x/m", "UpstreamServerError")
    await a.refresh()  # the two writes have not run yet: the store still says closed
    assert a.state("x/m") == "open"
    await a.flush()
    await a.refresh()
    assert a.state("x/m") == "open"


class DownStore(MemoryStore):
    """A store that is unreachable while ``down`` is set."""

    def __init__(self, clock):
        super().__init__(clock)
        self.down = True

    async def run(self, script, keys, args):
        if self.down:
            raise StoreUnavailableError("connection refused")
        return await super().run(script, keys, args)


async def test_store_outage_falls_back_to_the_local_machine():
    from structlog.testing import capture_logs

    clock = FakeClock()
    store = DownStore(clock)
    breakers = SharedBreakers(FAST, store, clock)
    with capture_logs() as logs:
        breakers.record("x/m", "UpstreamConnectError")
        breakers.record("x/m", "UpstreamConnectError")
        await breakers.flush()
        assert breakers.store_down and breakers.store_failures == 1  # one batched write
        assert breakers.state("x/m") == "open"
        await breakers.refresh()  # fails, keeps the local state
        assert breakers.state("x/m") == "open"
        clock.advance(5.0)
        assert await breakers.try_probe("x/m") is True  # local probe slot
        assert await breakers.try_probe("x/m") is False
        store.down = False
        await breakers.refresh()  # back: the shared state (nothing recorded) replaces local
    assert not breakers.store_down
    assert breakers.state("x/m") == "closed"
    events = [entry["event"] for entry in logs]
    assert events == ["breaker.store_unavailable", "breaker.store_recovered"]  # once each
    assert logs[0]["log_level"] == "warning" and logs[0]["fallback"] == "local"


async def test_background_refresh_loop_picks_up_remote_changes():
    import asyncio

    clock = FakeClock()
    store = MemoryStore(clock)
    a = SharedBreakers(FAST, store, clock)
    b = SharedBreakers(FAST, store, clock, refresh_s=0.001)
    b.state("x/m")
    await b.start()
    try:
        a.record("x/m", "UpstreamServerError")
        a.record("x/m", "UpstreamServerError")
        await a.flush()
        for _ in range(200):
            if b.state("x/m") == "open":
                break
            await asyncio.sleep(0.001)
        assert b.state("x/m") == "open"
    finally:
        await b.aclose()


def test_recording_without_an_event_loop_updates_local_state_only():
    clock = FakeClock()
    breakers = SharedBreakers(FAST, MemoryStore(clock), clock)
    breakers.record("x/m", "UpstreamServerError")
    breakers.record("x/m", "UpstreamServerError")
    assert breakers.state("x/m") == "open"


class SlowStore(MemoryStore):
    """Answers RECORD only when released, and writes down each batch it got."""

    def __init__(self, clock):
        super().__init__(clock)
        self.batches = []
        self.release = None

    async def run(self, script, keys, args):
        import asyncio

        if script is RECORD:
            self.batches.append(args[1])
            self.release = asyncio.Event()
            await self.release.wait()
        return await super().run(script, keys, args)


async def test_writes_are_ordered_and_batched_one_in_flight_per_target():
    import asyncio

    clock = FakeClock()
    store = SlowStore(clock)
    breakers = SharedBreakers(BreakerConfig(consecutive_failures=3), store, clock)
    breakers.record("x/m", None)
    await asyncio.sleep(0)  # the writer sends the first batch and waits
    for error in ("UpstreamServerError", "UpstreamServerError", "UpstreamBadRequestError"):
        breakers.record("x/m", error)
    await asyncio.sleep(0)
    assert store.batches == ["s"]  # the rest waits for the write in flight
    store.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.batches == ["s", "ffs"]
    store.release.set()
    await breakers.flush()
    fields = store.data.get("breaker:x/m")
    assert fields["c"] == 0 and breakers.state("x/m") == "closed"


async def test_track_replaces_the_targets_refreshed():
    """Discovery removes replicas: their breakers stop being read from the store."""
    clock = FakeClock()
    read: list[list[str]] = []

    class KeyLog(MemoryStore):
        async def run(self, script, keys, args):
            read.append(list(keys))
            return await super().run(script, keys, args)

    breakers = SharedBreakers(FAST, KeyLog(clock), clock)
    breakers.track(["pool@10.0.0.1/m", "pool@10.0.0.2/m"])
    await breakers.refresh()
    assert len(read[-1]) == 2
    breakers.track(["pool@10.0.0.1/m"])
    await breakers.refresh()
    assert read[-1] == [breakers.key("pool@10.0.0.1/m")]
