"""The admission queue: where requests wait while every eligible target is saturated.

Bounded, deadline-aware and weighted-fair between tenants:

- ``await queue.wait(tenant, deadline_s, ready)`` returns the seconds spent queued once
  ``ready()`` says there is capacity for this request and it is this request's turn. It
  raises ``RateLimitError`` (429, ``retry_after``) at once when ``max_size`` requests are
  already waiting, and ``ServiceUnavailableError`` (503, ``retry_after``) when ``deadline_s``
  (default ``QueueConfig.deadline_s``) passes first. A request that finds the queue empty and
  ``ready()`` true does not queue at all (0.0).
- ``notify()`` is called by whoever frees capacity (a request finishing, a metrics poll): it
  re-checks the waiters in fair order and releases the first whose ``ready()`` is true.
- Release order is start-time fair queuing by tenant weight (the pure ``FairQueue``): each
  request gets a virtual finish tag ``max(V, tenant's last tag) + cost / weight``; the smallest
  ready tag goes first. A tenant with twice the weight gets twice the releases while both
  wait; one tenant's burst queues behind its own tags, so a newcomer is served next instead of
  after the burst. FIFO within a tenant (among the requests that can go). Tags restart when
  the queue empties, so nobody carries a debt (or credit) from a past busy period.
- One release at a time: a released waiter's task runs before the next release is
  considered, so the released request can claim the capacity (``CapacityMonitor.sent``)
  before ``ready()`` is asked again; otherwise one freed slot would wake every waiter.
- Cancellation (the client went away) removes the waiter; if it had just been released,
  its turn passes to the next waiter.

Time comes from the injected clock: deadlines are checked on ``notify()``, ``expire()`` and a
loop timer armed for the earliest deadline, so tests advance a ``FakeClock`` and call
``expire()`` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from core.clock import Clock
from core.config_routing import QueueConfig
from core.errors import RateLimitError, ServiceUnavailableError

Ready = Callable[[], bool]
_MIN_WEIGHT = 1e-6

# The refusal of a batch item that found no target with room: it never waits in the queue
# (gateway.request.batch); counted as a queue refusal, not as a failed request.
BATCH_NO_ROOM = "queue:batch_no_room"


@dataclass(eq=False)
class Ticket:
    """One waiting request. ``start``/``finish`` are its virtual tags; times are clock
    seconds."""

    tenant: str
    seq: int
    start: float
    finish: float
    enqueued_at: float
    deadline: float
    ready: Ready = field(repr=False)

    @property
    def key(self) -> tuple[float, int]:
        return (self.finish, self.seq)


class FairQueue:
    """The pure core: weighted fair order of waiting tickets. No I/O, no asyncio."""

    def __init__(self, weights: Mapping[str, float], default_weight: float = 1.0) -> None:
        self._weights = dict(weights)
        self._default = default_weight
        self._order: list[Ticket] = []  # sorted by (finish, seq)
        self._keys: list[tuple[float, int]] = []  # the same keys, for bisect
        self._last_finish: dict[str, float] = {}
        self._vtime = 0.0
        self._seq = 0
        self._released: deque[float] = deque(maxlen=64)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        self._weights = dict(weights)

    def __len__(self) -> int:
        return len(self._order)

    def weight(self, tenant: str) -> float:
        return max(_MIN_WEIGHT, self._weights.get(tenant, self._default))

    def push(
        self, tenant: str, now: float, deadline: float, ready: Ready, cost: float = 1.0
    ) -> Ticket:
        """Queue a request of ``tenant``; its tag follows the tenant's previous one."""
        start = max(self._vtime, self._last_finish.get(tenant, 0.0))
        finish = start + max(cost, 0.0) / self.weight(tenant)
        self._last_finish[tenant] = finish
        ticket = Ticket(tenant, self._seq, start, finish, now, deadline, ready)
        self._seq += 1
        index = bisect.bisect(self._keys, ticket.key)
        self._keys.insert(index, ticket.key)
        self._order.insert(index, ticket)
        return ticket

    def ordered(self) -> list[Ticket]:
        """Waiting tickets in release order."""
        return list(self._order)

    def next_ready(self) -> Ticket | None:
        """The first ticket in fair order whose ``ready()`` is true (it stays queued). A
        ``ready`` that raises counts as ready: the request's own routing will report it."""
        for ticket in self._order:
            try:
                if ticket.ready():
                    return ticket
            except Exception:
                return ticket
        return None

    def release(self, ticket: Ticket, now: float) -> None:
        """Take ``ticket`` out as served: virtual time moves to its start tag."""
        self._drop(ticket)
        self._vtime = max(self._vtime, ticket.start)
        self._released.append(now)
        self._reset_if_empty()

    def remove(self, ticket: Ticket) -> bool:
        """Take ``ticket`` out unserved (cancelled, expired); False if it was not queued.
        Its tenant's tag is rolled back when it was the tenant's latest."""
        if not self._drop(ticket):
            return False
        if self._last_finish.get(ticket.tenant) == ticket.finish:
            self._last_finish[ticket.tenant] = ticket.start
        self._reset_if_empty()
        return True

    def expired(self, now: float) -> list[Ticket]:
        """Remove and return the tickets whose deadline is ``<= now``."""
        gone = [t for t in self._order if t.deadline <= now]
        for ticket in gone:
            self.remove(ticket)
        return gone

    def earliest_deadline(self) -> float | None:
        return min((t.deadline for t in self._order), default=None)

    def depth_by_tenant(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for ticket in self._order:
            depth[ticket.tenant] = depth.get(ticket.tenant, 0) + 1
        return depth

    def wait_estimate(self, now: float) -> float:
        """Seconds until a newcomer would likely be released, from the recent release rate;
        at least 1 s, at most 60 s; 1 s without enough history."""
        times = [t for t in self._released if now - t <= 60.0]
        if len(times) < 2 or times[-1] <= times[0]:
            return 1.0
        rate = (len(times) - 1) / (times[-1] - times[0])
        return float(min(60, max(1, math.ceil((len(self._order) + 1) / rate))))

    def _drop(self, ticket: Ticket) -> bool:
        index = bisect.bisect_left(self._keys, ticket.key)
        if index < len(self._order) and self._order[index] is ticket:
            del self._keys[index]
            del self._order[index]
            return True
        return False

    def _reset_if_empty(self) -> None:
        if not self._order:
            self._vtime = 0.0
            self._last_finish.clear()


class AdmissionQueue:
    """The asyncio shell around ``FairQueue``: futures, the deadline timer, cancellation."""

    def __init__(
        self,
        config: QueueConfig,
        weights: Mapping[str, float],
        clock: Clock,
        *,
        default_weight: float = 1.0,
    ) -> None:
        self.config = config
        self._clock = clock
        self._core = FairQueue(weights, default_weight)
        self._futures: dict[Ticket, asyncio.Future[None]] = {}
        self._handoff: Ticket | None = None  # released; its task has not resumed yet
        self._timer: asyncio.TimerHandle | None = None

    @property
    def depth(self) -> int:
        """Requests waiting now."""
        return len(self._core)

    def depth_by_tenant(self) -> dict[str, int]:
        return self._core.depth_by_tenant()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """New tenant weights (a policy reload); waiters keep their places."""
        self._core.set_weights(weights)

    async def wait(
        self, tenant: str | None, deadline_s: float | None, ready: Ready, cost: float = 1.0
    ) -> float:
        """Wait for capacity (see the module docstring); returns the seconds queued."""
        now = self._clock.now()
        if not self._core and self._handoff is None and ready():
            return 0.0
        if len(self._core) >= self.config.max_size:
            full = RateLimitError(
                "The gateway's request queue is full; retry later.",
                retry_after=self._core.wait_estimate(now),
            )
            full.refused_by = "queue:full"
            raise full
        limit = self.config.deadline_s if deadline_s is None else deadline_s
        loop = asyncio.get_running_loop()
        ticket = self._core.push(tenant or "", now, now + limit, ready, cost)
        future: asyncio.Future[None] = loop.create_future()
        self._futures[ticket] = future
        self._pump()
        self._arm_timer()
        try:
            await future
        except asyncio.CancelledError:
            self._cancelled(ticket)
            raise
        finally:
            self._futures.pop(ticket, None)
        self._resumed(ticket)
        return max(0.0, self._clock.now() - ticket.enqueued_at)

    def notify(self) -> None:
        """Capacity may have been freed: release the next waiter that can go, if any."""
        self._pump()

    def expire(self) -> None:
        """Fail the waiters whose deadline has passed (503)."""
        now = self._clock.now()
        for ticket in self._core.expired(now):
            future = self._futures.get(ticket)
            if future is not None and not future.done():
                waited = now - ticket.enqueued_at
                late = ServiceUnavailableError(
                    f"No capacity for this request within its {waited:.1f} s queue deadline.",
                    retry_after=self._core.wait_estimate(now),
                )
                late.refused_by = "queue:deadline"
                future.set_exception(late)

    def _pump(self) -> None:
        self.expire()
        if self._handoff is not None:
            return  # the released waiter claims its capacity first, then pumps again
        ticket = self._core.next_ready()
        if ticket is None:
            return
        self._core.release(ticket, self._clock.now())
        future = self._futures.get(ticket)
        if future is not None and not future.done():
            self._handoff = ticket
            future.set_result(None)

    def _resumed(self, ticket: Ticket) -> None:
        if self._handoff is ticket:
            self._handoff = None
        if self._core:
            # After this task's synchronous continuation (where it claims the capacity).
            asyncio.get_running_loop().call_soon(self._pump)

    def _cancelled(self, ticket: Ticket) -> None:
        if self._handoff is ticket:  # released, then cancelled: pass the turn on
            self._handoff = None
            asyncio.get_running_loop().call_soon(self._pump)
        else:
            self._core.remove(ticket)

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        earliest = self._core.earliest_deadline()
        if earliest is None:
            return
        delay = max(0.0, earliest - self._clock.now())
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()
        self._arm_timer()
