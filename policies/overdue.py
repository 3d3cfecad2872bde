"""Attempts still waiting for their first token: evidence that a target has slowed down,
read before any slow answer arrives.

Why: the TTFT fits and the load curve (``policies.load``) learn only when an answer
starts. A 4-slot box that starts queueing answers its queued requests seconds later, and
until then every new request is routed on samples taken while it was idle (end to end,
a third to a half of ``slo``'s misses came in the first 10 s: the box measured idle, then
queued at a load it had never been sampled at). An attempt that has waited ``age``
seconds without a first token is evidence now: its TTFT is more than ``age``.

Each attempt is registered when it starts with what it was predicted at: the load factor
the curve gave for its dispatch (``load_factor``) and its predicted TTFT's p99
(``p99_s``: the no-load model for its prompt x that factor x the spread's p99 tail).
Once it has waited past that p99, the target is at least ``age / p99_s`` times slower
than predicted at that load, so ``factor(label)`` is the largest implied load factor,
``load_factor x age / p99_s``, over the target's overdue attempts (1.0 when none is
overdue). Routing takes the larger of it and the curve's factor for the load there is
now (``LatencyStats.health``). An attempt ``QUEUE_SURPRISE`` (1.5x) or more past its p99
is a queue, not a tail: for a request sent with more in flight than it was, its factor
grows in proportion (``_queue_growth``).

The p99, not the median: a healthy target's ordinary tail (one attempt in a hundred) then
implies a factor just over the one it was sent at, growing only while it keeps waiting; a
queue implies a factor that grows with its wait, within a p99 of the queue's start. A
lower bound, never a guess: the attempt is treated as if it would answer this instant.

Unmeasured targets have no p99 and register nothing (``policies.cuts`` covers them). The
attempt leaves on its first token, failure, cut or cancellation (``finish``). Local to
the process: another replica's waiting attempts are not seen here.

Pure: time from the injected clock.
"""

from __future__ import annotations

import itertools

from msgspec import Struct

from core.clock import Clock

OVERDUE_Z = 2.3263  # the standard normal's p99: the tail a healthy target stays within
QUEUE_SURPRISE = 1.5  # past its p99 by this much: a queue, not a healthy target's tail
MAX_FACTOR = 100.0  # as policies.load's curve


class _Waiting(Struct, frozen=True):
    started: float  # clock.now() at dispatch
    per_second: float  # load_factor / p99_s: the implied factor per second of waiting
    load_factor: float
    in_flight: int = 0  # the others at the target when it was sent


class OverdueAttempts:
    """The attempts waiting for a first token, per target label (see the module
    docstring). ``start`` returns a ticket that ``finish`` takes back."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._tickets = itertools.count(1)
        self._labels: dict[int, str] = {}  # ticket -> label
        self._waiting: dict[str, dict[int, _Waiting]] = {}  # label -> ticket -> attempt

    def start(self, label: str, p99_s: float, load_factor: float, in_flight: int = 0) -> int | None:
        """Register an attempt predicted at ``p99_s`` (> 0) with ``load_factor``, sent
        with ``in_flight`` others at the target; None (nothing registered) for a
        prediction that is not a positive number."""
        if not p99_s > 0 or not load_factor > 0:
            return None
        ticket = next(self._tickets)
        per_second = load_factor / p99_s
        self._labels[ticket] = label
        attempt = _Waiting(self._clock.now(), per_second, load_factor, max(0, in_flight))
        self._waiting.setdefault(label, {})[ticket] = attempt
        return ticket

    def finish(self, ticket: int | None) -> None:
        """The attempt answered, failed, was cut or cancelled (a ticket twice: no-op)."""
        if ticket is None or (label := self._labels.pop(ticket, None)) is None:
            return
        attempts = self._waiting[label]
        attempts.pop(ticket, None)
        if not attempts:
            del self._waiting[label]

    def factor(self, label: str, in_flight: int = 0) -> float:
        """The largest load factor ``label``'s overdue attempts imply for a request sent
        with ``in_flight`` others there now; 1.0 if none is overdue."""
        now = self._clock.now()
        implied = 1.0
        for waiting in self._waiting.get(label, {}).values():
            factor = (now - waiting.started) * waiting.per_second
            if factor > waiting.load_factor:  # past its p99
                implied = max(implied, factor * _queue_growth(waiting, factor, in_flight))
        return min(implied, MAX_FACTOR)

    def queued(self, label: str) -> bool:
        """Whether an attempt at ``label`` waits past its p99 by ``QUEUE_SURPRISE`` or more:
        a queue, not a tail (``policies.slots`` reads it as evidence of slots)."""
        now = self._clock.now()
        return any(
            (now - waiting.started) * waiting.per_second >= waiting.load_factor * QUEUE_SURPRISE
            for waiting in self._waiting.get(label, {}).values()
        )

    def waiting(self, label: str) -> int:
        """How many registered attempts at ``label`` have no first token yet."""
        return len(self._waiting.get(label, {}))


def _queue_growth(waiting: _Waiting, factor: float, in_flight: int) -> float:
    """How much longer a request sent now waits than ``waiting`` did, when ``waiting``
    is past its p99 by ``QUEUE_SURPRISE`` or more: (in_flight + 1) / (its in_flight +
    1), at least 1. A queue's wait grows with the requests in front of it; a healthy
    target's ordinary tail is never that late, so a target without a queue (a managed
    API holding many requests) is not read slower for holding more.

    Why: at start-up the flooded 4-slot box had no band of its curve read slowed yet
    (its queued requests had not answered), and the overdue attempts' factor, x1.8-2.1
    for attempts sent at 5-6 in flight, was used as is for requests at 11-12 in flight;
    800 ms requests went there as the target least likely to be late, and missed."""
    if factor < waiting.load_factor * QUEUE_SURPRISE:
        return 1.0
    return max(1.0, (in_flight + 1) / (waiting.in_flight + 1))
