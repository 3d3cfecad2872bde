"""How many requests a target serves at once (its slots), and the wait for one to free.

Why: the load curve (``policies.load``) learns a target's slow-down per in-flight count
from answers, so it knows nothing of a load until requests sent at it have answered, and
the overdue attempts (``policies.overdue``) imply a slow-down that grows only with their
own wait. End to end, a run's first seconds sent requests to the 4-slot local box at 5-13
in flight while it was predicted idle there (its curve had bands at 3 or fewer); they
queued behind long answers and most of the run's start-up misses came from them. Yet the
gateway sees the queue's shape at once: four answers streaming, and a fifth attempt past
its p99 with no first token.

Per target label, local to the process (as ``policies.overdue``):

- ``held``: attempts this process has sent and not yet let go (``enter`` .. ``leave``);
- ``streaming``: those of them whose answer has started (``streaming`` .. ``leave``);
- ``slots``: the target's inferred number of slots. Evidence (``confirm(label, queued)``,
  checked whenever routing reads the target): an attempt waits past its p99 by
  ``policies.overdue.QUEUE_SURPRISE`` (a queue, not a healthy target's tail) while ``k >=
  1`` answers stream: ``slots`` becomes the larger of ``k`` and what it was. A target
  streaming more answers than ``slots`` at once has more: the inference is dropped until
  new evidence (a managed API whose rare slow tail coincided with its busiest moment is
  corrected by its next busier one);
- ``hold_s``: how long an answer keeps its slot after its first token, an EWMA of the
  streams that ended; before any has ended, the mean age of the open ones (a lower bound,
  growing while they last).

``wait_s(label, service_s)``: for a request sent now, the longer of two reads. With
``n`` held and ``S`` slots, it starts after ``n + 1 - S`` slots free up (0 below ``S``
held, or with no slots inferred), and each slot frees once per cycle, ``service_s +
hold_s`` (its service TTFT, then its stream):

- by Little's law, ``S`` cycles side by side: ``(n + 1 - S) x cycle / S``. A mean over
  the streams' ages, so it reads short when they started together;
- by the open streams: each frees its slot ``hold_s`` after its first token (now, if
  older), a slot not streaming one cycle from now; the requests ahead take the first
  slots to free, each holding its slot a cycle, and this one gets the next. End to end,
  the box at 4 in flight read a 1.2 s wait by Little's law, and a request sent there
  waited 3.7 s behind four answers that had just started.

``policies.latency`` hands it to routing as ``TargetHealth.ttft_queue_s``.

Pure: no I/O, time from the injected clock.
"""

from __future__ import annotations

import heapq
import itertools

from msgspec import Struct

from core.clock import Clock

DEFAULT_ALPHA = 0.2  # stream lengths: queues move fast, a few streams say enough


class _Target(Struct):
    held: int = 0
    streams: dict[int, float] = {}  # ticket -> clock.now() of its first token
    slots: int | None = None
    hold_s: float | None = None  # EWMA of stream lengths (first token -> leave)


class SlotQueues:
    """Slots and queue waits per target label (see the module docstring). ``enter``
    returns a ticket that ``streaming`` and ``leave`` take back."""

    def __init__(self, clock: Clock, alpha: float = DEFAULT_ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self._clock = clock
        self.alpha = alpha
        self._tickets = itertools.count(1)
        self._labels: dict[int, str] = {}  # ticket -> label
        self._targets: dict[str, _Target] = {}

    def enter(self, label: str) -> int:
        """An attempt sent to ``label``: held until ``leave``."""
        ticket = next(self._tickets)
        self._labels[ticket] = label
        self._targets.setdefault(label, _Target()).held += 1
        return ticket

    def streaming(self, ticket: int) -> None:
        """The attempt's answer started: it holds a slot until ``leave``. A target now
        streaming more answers than its inferred slots has more (the inference is
        dropped). Unknown or repeated tickets are ignored."""
        label = self._labels.get(ticket)
        if label is None:
            return
        target = self._targets[label]
        if ticket in target.streams:
            return
        target.streams[ticket] = self._clock.now()
        if target.slots is not None and len(target.streams) > target.slots:
            target.slots = None

    def leave(self, ticket: int | None) -> None:
        """The attempt let go of its target (answer ended, failed, cut or cancelled); a
        stream's length teaches ``hold_s``. Unknown or repeated tickets are ignored."""
        if ticket is None or (label := self._labels.pop(ticket, None)) is None:
            return
        target = self._targets[label]
        target.held -= 1
        started = target.streams.pop(ticket, None)
        if started is not None:
            length = max(0.0, self._clock.now() - started)
            old = target.hold_s
            target.hold_s = length if old is None else old + self.alpha * (length - old)

    def confirm(self, label: str, queued: bool) -> None:
        """Evidence of ``label``'s slots: ``queued`` says an attempt there waits past its
        p99 by the queue margin (``OverdueAttempts.queued``); the answers streaming now
        are then as many as the target serves at once (at least)."""
        target = self._targets.get(label)
        if not queued or target is None or not target.streams:
            return
        target.slots = max(target.slots or 0, len(target.streams))

    def slots(self, label: str) -> int | None:
        """``label``'s inferred slots (None: no evidence of a slot limit)."""
        target = self._targets.get(label)
        return None if target is None else target.slots

    def held(self, label: str) -> int:
        """The attempts this process holds at ``label``."""
        target = self._targets.get(label)
        return 0 if target is None else target.held

    def hold_s(self, label: str) -> float | None:
        """How long an answer at ``label`` keeps its slot after its first token: the EWMA
        of ended streams, else the open ones' mean age (None: no stream yet)."""
        target = self._targets.get(label)
        if target is None:
            return None
        if target.hold_s is not None:
            return target.hold_s
        if not target.streams:
            return None
        now = self._clock.now()
        return sum(now - started for started in target.streams.values()) / len(target.streams)

    def wait_s(self, label: str, service_s: float) -> float:
        """Seconds a request sent to ``label`` now waits for a slot (the longer of Little's
        law and the open streams' read, see the module docstring), ``service_s`` being the
        target's no-load TTFT; 0 when no slot limit is inferred or a slot is free."""
        target = self._targets.get(label)
        if target is None or not target.slots:
            return 0.0
        ahead = target.held + 1 - target.slots
        if ahead <= 0:
            return 0.0
        hold = self.hold_s(label) or 0.0
        cycle = max(0.0, service_s) + hold
        little = ahead * cycle / target.slots
        return max(little, self._next_free_s(target, hold, cycle, ahead))

    def _next_free_s(self, target: _Target, hold: float, cycle: float, ahead: int) -> float:
        """When the ``ahead``-th slot to free frees, from the open streams (see the module
        docstring)."""
        now = self._clock.now()
        free = [max(0.0, hold - (now - started)) for started in target.streams.values()]
        free += [cycle] * ((target.slots or 0) - len(free))
        heapq.heapify(free)
        for _ in range(ahead - 1):  # each request ahead holds the first slot to free a cycle
            heapq.heapreplace(free, free[0] + cycle)
        return free[0]
