"""When the JWKS is fetched again (policies/auth/jwks_schedule.py), on an injected clock:
max-age honoured within bounds, backoff after failures, and the unknown-kid rate limit as a
Hypothesis property (fetches are at least a cooldown apart, whatever the arrivals)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from policies.auth.jwks_schedule import MAX_REFRESH_S, RefreshSchedule, max_age_of


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"cache-control": "public, max-age=600"}, 600.0),
        ({"cache-control": "Max-Age=90, must-revalidate"}, 90.0),
        ({"cache-control": 'max-age="120"'}, 120.0),
        ({"cache-control": "public, max-age=600", "age": "100"}, 500.0),
        ({"cache-control": "max-age=60", "age": "600"}, 0.0),
        ({"cache-control": "max-age=60", "age": "soon"}, 60.0),
        ({"cache-control": "no-store"}, 0.0),
        ({"cache-control": "private, no-cache"}, 0.0),
        ({"cache-control": "s-maxage=600"}, None),
        ({"cache-control": "max-age=abc"}, None),
    ],
)
def test_max_age_of(headers, expected):
    assert max_age_of(headers) == expected


def schedule(clock: FakeClock, refresh_s: float = 300.0, cooldown_s: float = 30.0):
    return RefreshSchedule(clock, refresh_s=refresh_s, cooldown_s=cooldown_s)


def test_first_fetch_is_due_at_once_and_unknown_kids_may_fetch():
    plan = schedule(FakeClock())
    assert plan.due_in() == 0.0
    assert plan.may_fetch_for_unknown_kid()


@pytest.mark.parametrize(
    ("max_age", "lifetime"),
    [
        (None, 300.0),  # no max-age: refresh_s
        (600.0, 600.0),  # the IdP's max-age
        (0.0, 30.0),  # no-store / max-age=0: the cooldown is the floor
        (5.0, 30.0),
        (10 * 86_400.0, MAX_REFRESH_S),  # a year-long max-age is capped at a day
    ],
)
def test_a_success_schedules_the_refresh_before_the_lifetime_ends(max_age, lifetime):
    clock = FakeClock()
    plan = schedule(clock)
    plan.started()
    assert plan.succeeded(max_age) == lifetime
    assert plan.due_in() == pytest.approx(0.9 * lifetime)
    clock.advance(0.9 * lifetime)
    assert plan.due_in() == 0.0


def test_failures_back_off_from_the_cooldown_up_to_the_refresh_interval():
    clock = FakeClock()
    plan = schedule(clock, refresh_s=300.0, cooldown_s=30.0)
    delays = []
    for _ in range(6):
        plan.started()
        delays.append(plan.failed())
    assert delays == [30.0, 60.0, 120.0, 240.0, 300.0, 300.0]
    assert plan.due_in() == 300.0
    plan.started()
    plan.succeeded(None)  # a success resets the backoff
    plan.started()
    assert plan.failed() == 30.0


def test_unknown_kids_wait_for_the_cooldown_after_any_fetch():
    clock = FakeClock()
    plan = schedule(clock, cooldown_s=30.0)
    plan.started()  # e.g. the background refresh
    assert not plan.may_fetch_for_unknown_kid()
    clock.advance(29.9)
    assert not plan.may_fetch_for_unknown_kid()
    clock.advance(0.1)
    assert plan.may_fetch_for_unknown_kid()


@given(
    cooldown=st.floats(min_value=0.5, max_value=120.0),
    gaps=st.lists(st.floats(min_value=0.0, max_value=60.0), min_size=1, max_size=200),
)
def test_unknown_kid_fetches_are_at_least_a_cooldown_apart(cooldown, gaps):
    clock = FakeClock()
    plan = schedule(clock, cooldown_s=cooldown)
    starts = []
    for gap in gaps:
        clock.advance(gap)
        if plan.may_fetch_for_unknown_kid():
            plan.started()
            starts.append(clock.now())
    assert starts, "the first unknown kid may always fetch"
    assert all(b - a >= cooldown for a, b in itertools.pairwise(starts))
    assert len(starts) <= sum(gaps) / cooldown + 1
