"""The retry budget: a floor, a share of recent calls, a sliding window."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_routing import RetryBudgetConfig
from routers.retry_budget import RetryBudget


def test_floor_allows_min_per_s_times_window_without_calls():
    budget = RetryBudget(RetryBudgetConfig(ratio=0.2, min_per_s=0.5, window_s=10), FakeClock())
    assert [budget.try_retry("a") for _ in range(6)] == [True] * 5 + [False]
    assert budget.try_retry("b")  # per target


def test_calls_earn_a_share_of_retries():
    clock = FakeClock()
    budget = RetryBudget(RetryBudgetConfig(ratio=0.1, min_per_s=0.0, window_s=10), clock)
    assert not budget.try_retry("a")
    for _ in range(25):
        budget.record_call("a")
    assert budget.allowance("a") == 2.5
    assert [budget.try_retry("a") for _ in range(3)] == [True, True, False]


def test_the_window_slides_and_refills():
    clock = FakeClock()
    budget = RetryBudget(RetryBudgetConfig(ratio=0.0, min_per_s=0.2, window_s=10), clock)
    assert budget.try_retry("a") and budget.try_retry("a")
    assert not budget.try_retry("a")
    clock.advance(9.9)
    assert not budget.try_retry("a")
    clock.advance(0.1)  # the first two retries are now window_s old
    assert budget.try_retry("a")


events = st.lists(st.tuples(st.sampled_from(["call", "retry"]), st.floats(0, 3)), max_size=200)


@given(events, st.floats(0, 1), st.floats(0, 2), st.floats(1, 20))
def test_retries_in_any_window_stay_within_the_budget(sequence, ratio, min_per_s, window_s):
    clock = FakeClock()
    config = RetryBudgetConfig(ratio=ratio, min_per_s=min_per_s, window_s=window_s)
    budget = RetryBudget(config, clock)
    calls: list[float] = []
    retries: list[float] = []
    for kind, step in sequence:
        clock.advance(step)
        now = clock.now()
        if kind == "call":
            budget.record_call("a")
            calls.append(now)
        elif budget.try_retry("a"):
            retries.append(now)
            in_window = [t for t in retries if t > now - window_s]
            recent_calls = [t for t in calls if t > now - window_s]
            assert len(in_window) <= ratio * len(recent_calls) + min_per_s * window_s + 1e-9
