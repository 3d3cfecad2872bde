"""A target's slots inferred from its streaming answers, and the wait for one to free by
Little's law (``policies.slots``), through the latency stats, the gateway's attempt
observer, the TTFT prediction and the SLO strategy."""

from __future__ import annotations

import random

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.routing import RouteRequest, TargetHealth
from gateway.process.health import TrackerObserver
from policies.overdue import QUEUE_SURPRISE, OverdueAttempts
from policies.slots import SlotQueues
from routers.strategies.predict import ttft_s
from routers.strategies.slo import Slo
from tests.unit.test_overdue import measured, target, trackers_for


def streaming_box(
    clock: FakeClock, slots: SlotQueues, streams: int, label: str = "box"
) -> list[int]:
    """``streams`` attempts sent to ``label`` whose answers have started."""
    tickets = [slots.enter(label) for _ in range(streams)]
    for ticket in tickets:
        slots.streaming(ticket)
    return tickets


def test_no_slot_limit_is_inferred_without_a_queue():
    clock = FakeClock()
    slots = SlotQueues(clock)
    streaming_box(clock, slots, 4)
    slots.enter("box")  # a fifth, not yet answered
    slots.confirm("box", queued=False)
    assert slots.slots("box") is None and slots.wait_s("box", 0.25) == 0.0
    assert slots.slots("other") is None and slots.held("other") == 0
    slots.confirm("other", queued=True)  # nothing streams there: no evidence
    assert slots.slots("other") is None


def test_answers_streaming_while_another_queues_are_the_slots_and_set_the_wait():
    """Four answers stream while a fifth waits past its p99: four slots. Each frees once
    per 0.25 s of service + 2 s of stream, so with five held the next request waits for
    two of them: 2 x 2.25 / 4."""
    clock = FakeClock()
    slots = SlotQueues(clock)
    tickets = streaming_box(clock, slots, 4)
    slots.enter("box")
    clock.advance(2.0)
    assert slots.hold_s("box") == pytest.approx(2.0)  # none ended: the open ones' age
    slots.confirm("box", queued=True)
    assert slots.slots("box") == 4 and slots.held("box") == 5
    assert slots.wait_s("box", 0.25) == pytest.approx(2 * 2.25 / 4)
    slots.leave(tickets[0])  # its stream ended after 2 s: the EWMA starts there
    clock.advance(1.0)
    assert slots.hold_s("box") == pytest.approx(2.0)
    assert slots.wait_s("box", 0.25) == pytest.approx(1 * 2.25 / 4)
    slots.leave(tickets[1])  # 3 s: 2 + 0.2 x (3 - 2)
    assert slots.hold_s("box") == pytest.approx(2.2)
    assert slots.held("box") == 3 and slots.wait_s("box", 0.25) == 0.0  # a slot is free
    slots.leave(tickets[1])  # twice, or a ticket never given: nothing happens
    slots.leave(None)
    slots.streaming(999)
    assert slots.held("box") == 3


def test_answers_that_started_together_free_their_slots_together():
    """Streams last 2 s (0.25 s of service before each). Four answers start at once while
    a fifth request waits: the first slot frees 2 s from now, when that fifth one takes
    it, and the next request gets the second, also 2 s from now; Little's law (2 x 2.25 /
    4) would say 1.1 s. With four more waiting, the ninth takes the last of the four and
    the next waits for the first slot to free again, 2 + 2.25 s. A second later the
    streams free in 1 s, and Little's law (6 x 2.25 / 4), the longer read, holds."""
    clock = FakeClock()
    slots = SlotQueues(clock)
    first = streaming_box(clock, slots, 1)
    clock.advance(2.0)
    slots.leave(first[0])
    assert slots.hold_s("box") == pytest.approx(2.0)
    streaming_box(clock, slots, 4)
    slots.enter("box")
    slots.confirm("box", queued=True)
    assert slots.wait_s("box", 0.25) == pytest.approx(2.0)
    for _ in range(4):
        slots.enter("box")
    assert slots.wait_s("box", 0.25) == pytest.approx(4.25)
    clock.advance(1.0)
    assert slots.wait_s("box", 0.25) == pytest.approx(6 * 2.25 / 4)


def test_more_answers_streaming_than_the_slots_inferred_drop_the_inference():
    """A managed API whose rare slow tail came at its busiest moment so far looks
    slot-bound; its next busier moment proves it is not."""
    clock = FakeClock()
    slots = SlotQueues(clock)
    streaming_box(clock, slots, 3, "api")
    slots.confirm("api", queued=True)
    assert slots.slots("api") == 3
    streaming_box(clock, slots, 1, "api")
    assert slots.slots("api") is None and slots.wait_s("api", 0.3) == 0.0


def test_the_most_answers_seen_streaming_in_a_queue_count():
    """A slot busy with its service TTFT does not stream yet: evidence taken then reads one
    slot too few, and the next, with every slot streaming, raises it."""
    clock = FakeClock()
    slots = SlotQueues(clock)
    first = streaming_box(clock, slots, 3)
    fourth = slots.enter("box")
    slots.confirm("box", queued=True)
    assert slots.slots("box") == 3
    slots.streaming(fourth)  # a fourth answer: more than three slots
    slots.confirm("box", queued=True)
    assert slots.slots("box") == 4
    slots.leave(first[0])
    slots.confirm("box", queued=True)  # three stream now: still four slots
    assert slots.slots("box") == 4


def test_an_attempt_is_queued_only_past_its_p99_by_the_queue_margin():
    clock = FakeClock()
    overdue = OverdueAttempts(clock)
    ticket = overdue.start("box", p99_s=0.5, load_factor=1.0)
    clock.advance(0.5 * QUEUE_SURPRISE - 0.01)
    assert not overdue.queued("box")  # past its p99, but a tail can be that late
    clock.advance(0.02)
    assert overdue.queued("box") and not overdue.queued("other")
    overdue.finish(ticket)
    assert not overdue.queued("box")


@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["enter", "stream", "leave", "queued", "tick"]), st.integers(0, 9)
        ),
        max_size=60,
    )
)
def test_the_wait_is_zero_with_a_free_slot_and_grows_with_the_queue(events):
    """Whatever happens: the slots inferred are never fewer than one nor fewer than the
    answers streaming; the wait is 0 while a slot is free, and one more request held
    never shortens it."""
    clock = FakeClock()
    slots = SlotQueues(clock)
    tickets: list[int] = []
    for kind, pick in events:
        if kind == "enter":
            tickets.append(slots.enter("box"))
        elif kind == "stream" and tickets:
            slots.streaming(tickets[pick % len(tickets)])
        elif kind == "leave" and tickets:
            slots.leave(tickets.pop(pick % len(tickets)))
        elif kind == "queued":
            slots.confirm("box", queued=True)
        elif kind == "tick":
            clock.advance(pick / 4)
        inferred = slots.slots("box")
        wait = slots.wait_s("box", 0.25)
        assert wait >= 0.0
        if inferred is None or slots.held("box") < inferred:
            assert wait == 0.0
        else:
            assert inferred >= 1
            extra = slots.enter("box")
            assert slots.wait_s("box", 0.25) >= wait
            slots.leave(extra)


def test_the_prediction_is_the_longer_of_the_load_factor_and_the_slot_wait():
    req = RouteRequest(model="m", prompt_tokens=1000)
    health = TargetHealth(ttft_base_s=0.2, ttft_per_token_s=0.0001)  # 0.3 s at no load
    assert ttft_s(req, health) == pytest.approx(0.3)
    queued = TargetHealth(ttft_base_s=0.2, ttft_per_token_s=0.0001, ttft_queue_s=1.5)
    assert ttft_s(req, queued) == pytest.approx(1.8)
    slowed = TargetHealth(
        ttft_base_s=0.2, ttft_per_token_s=0.0001, ttft_load_factor=8.0, ttft_queue_s=1.5
    )
    assert ttft_s(req, slowed) == pytest.approx(2.4)
    ewma_only = TargetHealth(ttft_s=0.5, ttft_queue_s=1.0)
    assert ttft_s(req, ewma_only) == pytest.approx(1.5)


@pytest.mark.anyio
async def test_a_full_box_loses_tight_requests_the_moment_its_queue_shows():
    """The start-up miss: the box, measured idle at 3 or fewer in flight, streams four
    long answers and holds three more. As soon as one of those waits past its p99 by the
    queue margin, its slots are known and the wait for one (Little's law) is predicted,
    far more than the overdue attempt alone implies: 800 ms requests go to premium, and
    3 s ones once the streams have lasted long enough to fill that wait. When the
    streams end the box is free again."""
    clock = FakeClock()
    stats = measured(clock, label="box/m")
    for _ in range(20):
        stats.observe_ttft("premium/m", 0.3, 100, 0)
    async with httpx.AsyncClient() as client:
        trackers = trackers_for(stats, clock, client)
    candidates = [target("premium", 5.0), target("box", 0.05)]

    def first(slo_ms: int) -> str:
        req = RouteRequest(model="m", prompt_tokens=100, slo_ttft_ms=slo_ms)
        plan = Slo().plan(req, candidates, trackers.view(req), random.Random(0))
        return plan[0].target.provider_name

    observers = []
    for _ in range(7):
        observer = TrackerObserver(trackers)
        observer.prompt_tokens = 100
        observer.attempt_started("box/m")
        observers.append(observer)
    clock.advance(0.3)
    for observer in observers[:4]:
        observer.attempt_finished("box/m", error=None, ttft_s=0.3, retryable=False)
    clock.advance(1.5)  # the three others are queued
    health = trackers.view(RouteRequest(model="m")).health("box/m")
    assert stats.slots.slots("box/m") == 4
    # 7 held, 4 slots: 4 slots must free, each after ~0.25 s + the 1.5 s streamed so far.
    assert health.ttft_queue_s > 1.5 and health.ttft_queue_s > health.ttft_load_factor * 0.25
    loose = RouteRequest(model="m", prompt_tokens=100, slo_ttft_ms=3000)
    plan = Slo().plan(loose, candidates, trackers.view(loose), random.Random(0))
    box = next(r for r in plan if r.target.provider_name == "box")
    assert f"{health.ttft_queue_s:.1f}s queue" in box.reason
    assert first(800) == "premium"
    clock.advance(1.5)  # streams 3 s long so far: a slot wait past 3 s
    assert first(3000) == "premium"
    for observer in observers:
        if observer in observers[4:]:
            observer.attempt_finished("box/m", error=None, ttft_s=3.0, retryable=False)
        observer.release()
    assert stats.slots.held("box/m") == 0
    assert trackers.view(RouteRequest(model="m")).health("box/m").ttft_queue_s == 0.0
    assert first(800) == "box"
