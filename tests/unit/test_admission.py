"""policies.admission: the pure weighted-fair order (FairQueue) and the asyncio shell
(AdmissionQueue). Time is a FakeClock; deadlines pass by advancing it and calling expire()."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import FakeClock
from core.config_routing import QueueConfig
from core.errors import RateLimitError, ServiceUnavailableError
from policies.admission import AdmissionQueue, FairQueue


def always() -> bool:
    return True


def never() -> bool:
    return False


def drain(core: FairQueue, n: int | None = None) -> list[str]:
    """Release up to ``n`` ready tickets in order; the tenants served."""
    served: list[str] = []
    while (n is None or len(served) < n) and (ticket := core.next_ready()) is not None:
        core.release(ticket, now=0.0)
        served.append(ticket.tenant)
    return served


# ---------------------------------------------------------------- FairQueue (pure)
def test_fifo_within_a_tenant() -> None:
    core = FairQueue({})
    tickets = [core.push("a", 0.0, 10.0, always) for _ in range(5)]
    assert core.ordered() == tickets


def test_weights_set_the_share_while_both_wait() -> None:
    core = FairQueue({"a": 1.0, "b": 3.0})
    for _ in range(20):
        core.push("a", 0.0, 10.0, always)
        core.push("b", 0.0, 10.0, always)
    assert Counter(drain(core, 16)) == {"a": 4, "b": 12}


def test_a_burst_does_not_starve_a_newcomer() -> None:
    core = FairQueue({})
    for _ in range(100):
        core.push("bulk", 0.0, 10.0, always)
    assert drain(core, 10) == ["bulk"] * 10
    core.push("small", 0.0, 10.0, always)
    assert drain(core, 2) == ["small", "bulk"]


def test_no_debt_carried_after_the_queue_empties() -> None:
    core = FairQueue({})
    for _ in range(50):
        core.push("a", 0.0, 10.0, always)
    drain(core)
    assert len(core) == 0
    core.push("a", 0.0, 10.0, always)
    core.push("b", 0.0, 10.0, always)
    assert drain(core) == ["a", "b"]  # a is not pushed behind b for its earlier burst


def test_not_ready_tickets_are_skipped_and_raising_counts_as_ready() -> None:
    core = FairQueue({})
    blocked = core.push("a", 0.0, 10.0, never)
    free = core.push("b", 0.0, 10.0, always)
    assert core.next_ready() is free

    def broken() -> bool:
        raise RuntimeError("boom")

    core.release(free, 0.0)
    odd = core.push("c", 0.0, 10.0, broken)
    assert core.next_ready() is odd
    assert core.ordered()[0] is blocked


def test_removal_rolls_back_the_tenants_tag() -> None:
    core = FairQueue({})
    core.push("a", 0.0, 10.0, always)
    last = core.push("a", 0.0, 10.0, always)
    assert core.remove(last) and not core.remove(last)
    again = core.push("a", 0.0, 10.0, always)
    assert again.finish == last.finish  # the cancelled request cost the tenant nothing


def test_expired_tickets_leave_in_deadline_order_of_check() -> None:
    core = FairQueue({})
    early = core.push("a", 0.0, 5.0, never)
    late = core.push("b", 0.0, 9.0, never)
    assert core.earliest_deadline() == 5.0
    assert core.expired(4.9) == []
    assert core.expired(5.0) == [early]
    assert core.ordered() == [late] and core.earliest_deadline() == 9.0


def test_wait_estimate_from_the_release_rate() -> None:
    core = FairQueue({})
    assert core.wait_estimate(0.0) == 1.0  # no history
    for i in range(11):
        ticket = core.push("a", float(i), 100.0, always)
        core.release(ticket, now=float(i) * 0.5)  # 2 releases per second
    for _ in range(9):
        core.push("a", 10.0, 100.0, never)
    assert core.wait_estimate(5.0) == 5.0  # (9 + 1) waiting / 2 per s
    assert core.depth_by_tenant() == {"a": 9}


@given(
    st.lists(st.sampled_from("abc"), min_size=1, max_size=60),
    st.dictionaries(st.sampled_from("abc"), st.sampled_from([0.5, 1.0, 2.0, 4.0])),
)
def test_backlogged_tenants_get_their_weighted_share(
    arrivals: list[str], weights: dict[str, float]
) -> None:
    # Everyone queued up front; while two tenants both still wait, their normalised service
    # counts never differ by more than one request's worth of each (the SFQ bound).
    core = FairQueue(weights)
    for tenant in arrivals:
        core.push(tenant, 0.0, 10.0, always)
    left = Counter(arrivals)
    served: Counter[str] = Counter()
    while (ticket := core.next_ready()) is not None:
        core.release(ticket, 0.0)
        served[ticket.tenant] += 1
        left[ticket.tenant] -= 1
        waiting = [t for t in left if left[t] > 0]
        for x in waiting:
            for y in waiting:
                wx, wy = core.weight(x), core.weight(y)
                assert served[x] / wx - served[y] / wy <= 1 / wx + 1 / wy + 1e-9
    assert sum(served.values()) == len(arrivals)


# ---------------------------------------------------------------- AdmissionQueue (asyncio)
async def settle() -> None:
    """Let every runnable task run (no time passes: the FakeClock does not move)."""
    for _ in range(20):
        await asyncio.sleep(0)


def queue(
    max_size: int = 8, deadline_s: float = 10.0, **weights: float
) -> tuple[AdmissionQueue, FakeClock]:
    clock = FakeClock()
    return AdmissionQueue(
        QueueConfig(max_size=max_size, deadline_s=deadline_s), weights, clock
    ), clock


@pytest.mark.anyio
async def test_no_wait_when_the_queue_is_empty_and_capacity_is_there() -> None:
    q, _ = queue()
    assert await q.wait("t", None, always) == 0.0
    assert q.depth == 0


@pytest.mark.anyio
async def test_released_on_notify_with_the_seconds_queued() -> None:
    q, clock = queue()
    free = [False]
    task = asyncio.create_task(q.wait("t", None, lambda: free[0]))
    await settle()
    assert q.depth == 1 and not task.done()
    q.notify()  # nothing freed yet: stays
    await settle()
    assert not task.done()
    clock.advance(2.5)
    free[0] = True
    q.notify()
    assert await task == 2.5
    assert q.depth == 0


@pytest.mark.anyio
async def test_full_queue_is_429_with_retry_after() -> None:
    q, _ = queue(max_size=1)
    first = asyncio.create_task(q.wait("t", None, never))
    await settle()
    with pytest.raises(RateLimitError) as info:
        await q.wait("u", None, never)
    assert info.value.status == 429 and info.value.retry_after is not None
    assert info.value.retry_after >= 1
    first.cancel()
    await settle()
    q0, _ = queue(max_size=0)
    with pytest.raises(RateLimitError):
        await q0.wait("t", None, never)


@pytest.mark.anyio
async def test_deadline_is_503() -> None:
    q, clock = queue(deadline_s=10.0)
    short = asyncio.create_task(q.wait("t", 3.0, never))
    default = asyncio.create_task(q.wait("t", None, never))
    await settle()
    clock.advance(3.0)
    q.expire()
    with pytest.raises(ServiceUnavailableError) as info:
        await short
    assert info.value.status == 503 and info.value.retry_after is not None
    assert not default.done() and q.depth == 1
    clock.advance(7.0)
    q.notify()  # notify checks deadlines too
    with pytest.raises(ServiceUnavailableError):
        await default
    assert q.depth == 0


@pytest.mark.anyio
async def test_deadline_timer_fires_on_the_loop() -> None:
    # With a clock that moves with the loop, the armed timer expires waiters on its own.
    class LoopClock(FakeClock):
        def now(self) -> float:
            return asyncio.get_running_loop().time()

    q = AdmissionQueue(QueueConfig(), {}, LoopClock())
    with pytest.raises(ServiceUnavailableError):
        await asyncio.wait_for(q.wait("t", 0.01, never), timeout=5)


@pytest.mark.anyio
async def test_cancelled_waiter_leaves_the_queue() -> None:
    q, _ = queue()
    task = asyncio.create_task(q.wait("t", None, never))
    await settle()
    assert q.depth == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert q.depth == 0 and q.depth_by_tenant() == {}


@pytest.mark.anyio
async def test_one_release_at_a_time_and_each_claims_its_slot() -> None:
    q, _ = queue()
    slots = [0]
    served: list[int] = []

    async def request(n: int) -> None:
        await q.wait("t", None, lambda: slots[0] > 0)
        slots[0] -= 1  # what CapacityMonitor.sent does for the real thing
        served.append(n)

    tasks = [asyncio.create_task(request(n)) for n in range(4)]
    await settle()
    slots[0] = 2
    q.notify()
    await settle()
    assert served == [0, 1] and slots[0] == 0 and q.depth == 2
    slots[0] = 5
    q.notify()
    await asyncio.gather(*tasks)
    assert served == [0, 1, 2, 3]


@pytest.mark.anyio
async def test_released_then_cancelled_passes_the_turn_on() -> None:
    q, _ = queue()
    slots = [0]
    first = asyncio.create_task(q.wait("t", None, lambda: slots[0] > 0))
    second = asyncio.create_task(q.wait("t", None, lambda: slots[0] > 0))
    await settle()
    slots[0] = 1
    q.notify()  # releases `first`, whose task has not run yet...
    first.cancel()  # ...and the client goes away before it does
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, timeout=5) == 0.0


@pytest.mark.anyio
async def test_weighted_release_order_through_the_shell() -> None:
    q, _ = queue(max_size=64, gold=3.0, free=1.0)
    slots = [0]
    served: list[str] = []

    async def request(tenant: str) -> None:
        await q.wait(tenant, None, lambda: slots[0] > 0)
        slots[0] -= 1
        served.append(tenant)

    tasks = [asyncio.create_task(request("free")) for _ in range(12)]
    tasks += [asyncio.create_task(request("gold")) for _ in range(12)]
    await settle()
    slots[0] = 8
    q.notify()
    await settle()
    assert Counter(served) == {"gold": 6, "free": 2}
    slots[0] = 100
    q.notify()
    await asyncio.gather(*tasks)
    assert len(served) == 24
