"""The restart schedule and the replica state machine, on a fake clock."""

from __future__ import annotations

import pytest

from core.clock import FakeClock
from local_tier.workers.backoff import RestartSchedule
from local_tier.workers.lifecycle import IllegalMove, ReplicaRecord, State


def test_the_wait_doubles_up_to_the_maximum() -> None:
    schedule = RestartSchedule(0.5, 4.0, FakeClock())
    assert [schedule.failed() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert schedule.streak == 6


def test_a_replica_that_stayed_ready_long_enough_starts_the_streak_afresh() -> None:
    clock = FakeClock()
    schedule = RestartSchedule(1.0, 10.0, clock)
    assert [schedule.failed() for _ in range(3)] == [1.0, 2.0, 4.0]
    schedule.ready()
    clock.advance(9.0)  # ready, but not for max_s: still a crash loop
    assert schedule.failed() == 8.0
    schedule.ready()
    clock.advance(10.0)
    assert schedule.failed() == 1.0
    assert schedule.failed() == 2.0  # failed while starting: no ready time to forgive it


def test_new_limits_apply_to_the_running_streak() -> None:
    schedule = RestartSchedule(1.0, 60.0, FakeClock())
    schedule.failed()
    schedule.configure(0.1, 0.15)
    assert schedule.failed() == 0.15


def test_a_replica_moves_through_its_life_and_counts_restarts() -> None:
    clock = FakeClock()
    record = ReplicaRecord(clock)
    record.launched(pid=10, port=9000, restart=False)
    record.move(State.READY)
    assert record.serving
    clock.advance(2.0)
    record.crashed(-9)
    assert (record.state, record.exit_code, record.serving) == (State.CRASHED, -9, False)
    record.backing_off(1.5)
    assert record.retry_at == clock.now() + 1.5
    clock.advance(1.5)
    record.launched(pid=11, port=9000, restart=True)
    assert (record.state, record.pid, record.restarts, record.retry_at) == (
        State.STARTING,
        11,
        1,
        None,
    )
    record.move(State.DRAINING)
    record.stopped()
    assert (record.state, record.pid) == (State.STOPPED, None)


def test_moves_the_machine_does_not_have_are_refused() -> None:
    record = ReplicaRecord(FakeClock())
    with pytest.raises(IllegalMove):
        record.move(State.BACKOFF)  # starting -> backoff skips crashed
    record.move(State.DRAINING)
    with pytest.raises(IllegalMove):
        record.move(State.READY)  # a draining replica never serves again
    record.stopped()
    with pytest.raises(IllegalMove):
        record.move(State.STARTING)
