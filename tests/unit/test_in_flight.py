"""The gateway's in-flight counts: interactive requests apart from batch items, and how
long it has been since the last interactive one ended (batch work waits for a quiet
spell, not merely for a gap between two requests of a burst)."""

from __future__ import annotations

import pytest

from core.clock import FakeClock
from gateway.process.state import InFlight


def test_batch_items_are_in_flight_but_not_interactive() -> None:
    counts = InFlight(FakeClock())
    counts.enter(interactive=False)
    assert (counts.requests, counts.interactive) == (1, 0)
    counts.leave(interactive=False)
    assert (counts.requests, counts.interactive) == (0, 0)


def test_quiet_time_counts_from_the_last_interactive_end() -> None:
    clock = FakeClock()
    counts = InFlight(clock)
    assert counts.interactive_quiet_for() == float("inf")  # none ever ran
    counts.enter()
    counts.enter()
    clock.advance(5)
    assert counts.interactive_quiet_for() == 0.0  # in flight
    counts.leave()
    clock.advance(1)
    assert counts.interactive_quiet_for() == 0.0  # the other one still is
    counts.leave()
    clock.advance(1.5)
    assert counts.interactive_quiet_for() == pytest.approx(1.5)
    counts.enter(interactive=False)  # a batch item does not reset it
    counts.leave(interactive=False)
    clock.advance(0.5)
    assert counts.interactive_quiet_for() == pytest.approx(2.0)


@pytest.mark.anyio
async def test_drained_waits_for_every_request_interactive_or_not() -> None:
    counts = InFlight(FakeClock())
    counts.enter(interactive=False)
    assert not await counts.drained(0.01)
    counts.leave(interactive=False)
    assert await counts.drained(0.01)
