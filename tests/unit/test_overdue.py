"""Attempts waiting for their first token as evidence of a slow-down (``policies.overdue``),
through the latency stats, the gateway's attempt observer and the SLO strategy."""

from __future__ import annotations

import math
import random

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_routing import BreakerConfig
from core.config_tenants import Price
from core.protocols import Timeouts
from core.routing import RouteRequest
from gateway.process.health import TrackerObserver, Trackers
from local_tier.capacity import CapacityMonitor
from policies.breaker import SharedBreakers
from policies.latency import LatencyStats
from policies.overdue import MAX_FACTOR, OVERDUE_Z, QUEUE_SURPRISE, OverdueAttempts
from policies.store.memory import MemoryStore
from routers.strategies.slo import Slo
from routers.targets import Target


def test_an_attempt_implies_nothing_until_it_has_waited_past_its_p99():
    clock = FakeClock()
    overdue = OverdueAttempts(clock)
    assert overdue.factor("box") == 1.0
    ticket = overdue.start("box", p99_s=0.5, load_factor=1.0)
    clock.advance(0.5)
    assert overdue.factor("box") == 1.0  # at its p99: an ordinary tail
    clock.advance(1.5)
    assert overdue.factor("box") == pytest.approx(4.0)  # 2 s waited of a 0.5 s p99
    clock.advance(1.0)
    assert overdue.factor("box") == pytest.approx(6.0)  # a queue: it keeps growing
    assert overdue.factor("other") == 1.0 and overdue.waiting("box") == 1
    overdue.finish(ticket)
    assert overdue.factor("box") == 1.0 and overdue.waiting("box") == 0
    overdue.finish(ticket)  # twice, or a ticket never given: nothing happens
    overdue.finish(None)


def test_the_factor_is_relative_to_the_load_each_attempt_was_sent_at():
    """Sent at a load factor of 2 (its p99 counts that), 3 s of a 1 s p99 implies 6."""
    clock = FakeClock()
    overdue = OverdueAttempts(clock)
    overdue.start("box", p99_s=1.0, load_factor=2.0)
    clock.advance(1.5)
    late = overdue.start("box", p99_s=0.2, load_factor=1.0)
    clock.advance(1.5)
    # The first: 3 s x 2 / 1 s = 6; the second: 1.5 s / 0.2 s = 7.5, the larger one counts.
    assert overdue.factor("box") == pytest.approx(7.5)
    overdue.finish(late)
    assert overdue.factor("box") == pytest.approx(6.0)


def test_an_attempt_late_enough_to_be_queued_implies_more_for_a_longer_queue():
    """Sent with 5 others, 0.9 s past a 0.5 s p99 (x1.8): a queue. A request sent now with
    11 others waits behind twice as many: x3.6. Below ``QUEUE_SURPRISE`` the lateness
    is read as a tail and the load now does not scale it; nor does a shorter queue."""
    clock = FakeClock()
    overdue = OverdueAttempts(clock)
    overdue.start("box", p99_s=0.5, load_factor=1.0, in_flight=5)
    clock.advance(0.5 * (QUEUE_SURPRISE - 0.1))
    assert overdue.factor("box", in_flight=11) == pytest.approx(QUEUE_SURPRISE - 0.1)
    clock.advance(0.5 * (1.8 - QUEUE_SURPRISE + 0.1))
    assert overdue.factor("box", in_flight=11) == pytest.approx(1.8 * 12 / 6)
    assert overdue.factor("box", in_flight=2) == pytest.approx(1.8)
    assert overdue.factor("box") == pytest.approx(1.8)


def test_nonsense_predictions_register_nothing_and_the_factor_is_capped():
    clock = FakeClock()
    overdue = OverdueAttempts(clock)
    assert overdue.start("box", p99_s=0.0, load_factor=1.0) is None
    assert overdue.start("box", p99_s=math.nan, load_factor=1.0) is None
    assert overdue.start("box", p99_s=1.0, load_factor=0.0) is None
    overdue.start("box", p99_s=0.01, load_factor=1.0)
    clock.advance(3600)
    assert overdue.factor("box") == MAX_FACTOR


@given(
    st.lists(
        st.tuples(st.floats(0.01, 10), st.floats(1, 10), st.floats(0, 30), st.booleans()),
        max_size=20,
    ),
    st.integers(0, 30),
)
def test_the_factor_is_at_least_one_grows_with_waiting_and_ends_with_the_attempts(
    attempts, in_flight
):
    clock = FakeClock()
    overdue = OverdueAttempts(clock)
    tickets = []
    for index, (p99_s, load_factor, gap_s, _) in enumerate(attempts):
        tickets.append(overdue.start("box", p99_s, load_factor, in_flight=index % 7))
        clock.advance(gap_s)
    before = overdue.factor("box", in_flight)
    clock.advance(1.0)
    after = overdue.factor("box", in_flight)
    assert 1.0 <= before <= after <= MAX_FACTOR
    assert overdue.factor("box", in_flight + 1) >= after  # more in front: never quicker
    for ticket, (_, _, _, finish) in zip(tickets, attempts, strict=True):
        if finish:
            overdue.finish(ticket)
    assert overdue.factor("box", in_flight) <= after
    for ticket in tickets:
        overdue.finish(ticket)
    assert overdue.factor("box", in_flight) == 1.0 and overdue.waiting("box") == 0


def measured(clock: FakeClock, ttft_s: float = 0.25, label: str = "box") -> LatencyStats:
    """Latency stats with ``label`` measured idle: 0.25 s for a 100-token prompt."""
    stats = LatencyStats(clock)
    rng = random.Random(1)
    for _ in range(20):
        stats.observe_ttft(label, ttft_s * math.exp(rng.gauss(0, 0.2)), 100, 0)
    return stats


def trackers_for(stats: LatencyStats, clock: FakeClock, client: httpx.AsyncClient) -> Trackers:
    """The gateway's trackers around ``stats`` (no local replicas)."""
    breakers = SharedBreakers(BreakerConfig(), MemoryStore(clock), clock)
    return Trackers(breakers, stats, CapacityMonitor({}, client, clock))


def test_latency_stats_register_measured_attempts_and_raise_the_load_factor():
    clock = FakeClock()
    stats = measured(clock)
    assert stats.attempt_started("new", prompt_tokens=100, in_flight=0) is None  # unmeasured
    assert stats.attempt_started("box", in_flight=0) is None  # the prompt unknown
    ticket = stats.attempt_started("box", prompt_tokens=100, in_flight=0)
    assert ticket is not None and stats.overdue.waiting("box") == 1
    health = stats.health("box", in_flight=1)
    p99 = health.ttft_s * math.exp(OVERDUE_Z * health.ttft_spread)
    assert p99 < 1.0 and health.ttft_load_factor == 1.0
    clock.advance(3.0)  # queued behind a full box: no first token after 3 s
    assert stats.health("box", in_flight=1).ttft_load_factor > 3.0
    # Cancelled (the client left): no sample, no cut, and the evidence is gone with it.
    stats.attempt_finished(
        "box", error="CancelledError", ttft_s=None, retryable=False, ticket=ticket
    )
    assert stats.health("box", in_flight=0).ttft_load_factor == 1.0


@pytest.mark.parametrize(
    "outcome",
    [
        {"error": None, "ttft_s": 0.3},
        {"error": "AttemptDeadlineError", "ttft_s": 3.0},
        {"error": "UpstreamServerError", "ttft_s": None},
        {"error": "CancelledError", "ttft_s": None},
    ],
)
@pytest.mark.anyio
async def test_the_gateways_observer_ends_each_attempts_wait_whatever_its_outcome(outcome):
    clock = FakeClock()
    stats = measured(clock)
    async with httpx.AsyncClient() as client:
        trackers = trackers_for(stats, clock, client)
    observer = TrackerObserver(trackers)
    observer.prompt_tokens = 100
    observer.attempt_started("box")
    assert stats.overdue.waiting("box") == 1
    clock.advance(3.0)
    assert trackers.view(RouteRequest(model="m")).health("box").ttft_load_factor > 1.0
    observer.attempt_finished("box", retryable=False, **outcome)
    assert stats.overdue.waiting("box") == 0
    observer.release()
    assert trackers.load.count("box") == 0


def target(name: str, price: float) -> Target:
    return Target(
        alias="m",
        provider_name=name,
        model="m",
        provider=None,  # type: ignore[arg-type]  # planning never calls it
        timeouts=Timeouts(),
        price=Price(input_per_mtok=price, output_per_mtok=price),
    )


@pytest.mark.anyio
async def test_a_box_measured_idle_loses_tight_requests_once_one_of_its_requests_is_overdue():
    """The cold-start miss end to end: the box (cheapest) was measured idle and keeps
    getting 800 ms requests while its queue grows unseen. One request waiting 1 s past
    a 0.4 s p99 moves them to premium before any slow answer arrives."""
    clock = FakeClock()
    stats = measured(clock, label="box/m")
    for _ in range(20):
        stats.observe_ttft("premium/m", 0.3, 100, 0)
    async with httpx.AsyncClient() as client:
        trackers = trackers_for(stats, clock, client)
    candidates = [target("premium", 5.0), target("box", 0.05)]
    tight = RouteRequest(model="m", prompt_tokens=100, slo_ttft_ms=800)

    def first() -> str:
        plan = Slo().plan(tight, candidates, trackers.view(tight), random.Random(0))
        return plan[0].target.provider_name

    assert first() == "box"
    observer = TrackerObserver(trackers)
    observer.prompt_tokens = 100
    observer.attempt_started("box/m")
    clock.advance(1.4)
    assert first() == "premium"
    observer.attempt_finished("box/m", error=None, ttft_s=1.4, retryable=False)
    observer.release()
    assert stats.overdue.waiting("box/m") == 0
