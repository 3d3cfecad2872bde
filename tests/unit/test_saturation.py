"""local_tier.saturation: the pure hysteresis rule and the between-polls estimate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config_routing import SaturationConfig
from local_tier.saturation import ReplicaSignals, SaturationRule, estimate

CFG = SaturationConfig(stale_after_s=1.0, max_waiting=0, kv_high=0.9, kv_low=0.75)
NOW = 100.0


def fresh(**kw: float) -> ReplicaSignals:
    return ReplicaSignals(read_at=NOW - 0.1, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("previous", [False, True])
def test_no_signals_or_stale_signals_are_saturated(previous: bool) -> None:
    rule = SaturationRule(CFG)
    assert rule.update(previous, ReplicaSignals(read_at=None), NOW) is True
    assert rule.update(previous, ReplicaSignals(read_at=NOW - 1.01), NOW) is True
    # Exactly at the limit still counts as fresh.
    assert rule.update(False, ReplicaSignals(read_at=NOW - 1.0), NOW) is False


@pytest.mark.parametrize(
    ("signals", "why"),
    [
        (fresh(waiting=1), "a queue beyond max_waiting"),
        (fresh(kv_usage=0.9), "KV at the high mark"),
        (fresh(kv_usage=1.0, waiting=5), "both"),
    ],
)
def test_enters_at_the_high_marks(signals: ReplicaSignals, why: str) -> None:
    assert SaturationRule(CFG).update(False, signals, NOW) is True, why


def test_max_in_flight_applies_only_when_set() -> None:
    busy = fresh(in_flight=8)
    assert SaturationRule(CFG).update(False, busy, NOW) is False
    limited = SaturationRule(SaturationConfig(max_in_flight=8))
    assert limited.update(False, busy, NOW) is True
    assert limited.update(True, fresh(in_flight=7), NOW) is False


def test_leaves_only_below_the_low_marks() -> None:
    rule = SaturationRule(CFG)
    assert rule.update(True, fresh(kv_usage=0.8), NOW) is True  # inside the band: stays
    assert rule.update(False, fresh(kv_usage=0.8), NOW) is False  # ...either way
    assert rule.update(True, fresh(kv_usage=0.74), NOW) is False
    assert rule.update(True, fresh(kv_usage=0.5, waiting=1), NOW) is True


def test_waiting_allowance() -> None:
    rule = SaturationRule(SaturationConfig(max_waiting=2))
    assert rule.update(False, fresh(waiting=2), NOW) is False
    assert rule.update(False, fresh(waiting=3), NOW) is True
    assert rule.update(True, fresh(waiting=2), NOW) is False


def test_inverted_marks_are_refused() -> None:
    with pytest.raises(ValueError):
        SaturationRule(SaturationConfig(kv_high=0.5, kv_low=0.6))


@given(
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50),
    st.booleans(),
)
def test_no_flapping_inside_the_band(a: float, b: float, kvs: list[float], start: bool) -> None:
    low, high = min(a, b), max(a, b)
    rule = SaturationRule(SaturationConfig(kv_low=low, kv_high=high))
    state = start
    for kv in kvs:
        new = rule.update(state, fresh(kv_usage=kv), NOW)
        if low <= kv < high:
            assert new == state  # inside the band the state never changes
        else:
            assert new == (kv >= high)
        state = new


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 5)), min_size=1, max_size=40))
def test_state_changes_only_on_a_mark(steps: list[tuple[float, int]]) -> None:
    # Every switch on is justified by a high mark, every switch off by all low marks.
    rule = SaturationRule(CFG)
    state = True
    for kv, waiting in steps:
        signals = fresh(kv_usage=kv, waiting=waiting)
        new = rule.update(state, signals, NOW)
        if new and not state:
            assert rule.high(signals)
        if state and not new:
            assert rule.low(signals)
        state = new


# ---------------------------------------------------------------- estimate
def test_burst_fills_known_slots_then_waits() -> None:
    signals = estimate(NOW, 2, 0, 0.1, net_sent=10, in_flight=10, slots=8)
    assert (signals.running, signals.waiting, signals.in_flight) == (8, 4, 10)
    assert SaturationRule(CFG).update(False, signals, NOW) is True


def test_without_slots_a_burst_only_adds_to_running() -> None:
    signals = estimate(NOW, 2, 0, 0.1, net_sent=10, in_flight=10, slots=None)
    assert (signals.running, signals.waiting) == (12, 0)


def test_a_polled_queue_means_the_batch_is_full() -> None:
    # Running 4 with a queue: the batch holds 4, so new requests wait.
    signals = estimate(NOW, 4, 1, 0.1, net_sent=2, in_flight=2, slots=None)
    assert (signals.running, signals.waiting) == (4, 3)


def test_finishing_requests_let_the_queue_in_first() -> None:
    signals = estimate(NOW, 8, 3, 0.1, net_sent=-2, in_flight=0, slots=8)
    assert (signals.running, signals.waiting) == (8, 1)
    drained = estimate(NOW, 8, 3, 0.1, net_sent=-20, in_flight=0, slots=8)
    assert (drained.running, drained.waiting) == (0, 0)


@given(
    st.integers(0, 64),
    st.integers(0, 64),
    st.integers(-80, 80),
    st.one_of(st.none(), st.integers(0, 64)),
)
def test_estimate_conserves_requests(
    running: int, waiting: int, net: int, slots: int | None
) -> None:
    signals = estimate(NOW, running, waiting, 0.0, net_sent=net, in_flight=0, slots=slots)
    assert signals.running >= 0 and signals.waiting >= 0
    assert signals.running + signals.waiting == max(0, running + waiting + net)
    if slots is not None:
        assert signals.running <= max(slots, running)
