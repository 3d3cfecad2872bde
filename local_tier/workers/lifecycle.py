"""The states of one worker replica and the moves between them (pure, clock injected).

::

    starting --healthy--> ready --exited--> crashed --wait--> backoff --restart--> starting
        \\--exited/timed out--> crashed           backoff --launch failed--> crashed
    any but stopped --drain--> draining --stopped--> stopped

``starting``: launched, ``/health`` not yet 200. ``ready``: served as a replica of its
provider. ``crashed``: its process group exited (or it did not become healthy in time) and
has been cleaned up. ``backoff``: waiting before the restart. ``draining``: out of the
routing table, finishing what it runs before it is stopped. ``stopped``: gone for good
(this record is no longer managed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from core.clock import Clock


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    CRASHED = "crashed"
    BACKOFF = "backoff"
    DRAINING = "draining"
    STOPPED = "stopped"


_MOVES: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.READY, State.CRASHED, State.DRAINING}),
    State.READY: frozenset({State.CRASHED, State.DRAINING}),
    State.CRASHED: frozenset({State.BACKOFF, State.DRAINING}),
    # to crashed: the restart could not even be launched (no free port, no such program)
    State.BACKOFF: frozenset({State.STARTING, State.CRASHED, State.DRAINING}),
    State.DRAINING: frozenset({State.STOPPED}),
    State.STOPPED: frozenset(),
}


class IllegalMove(RuntimeError):
    """A move the state machine does not have (a supervisor bug)."""


def can_move(source: State, target: State) -> bool:
    return target in _MOVES[source]


@dataclass
class ReplicaRecord:
    """What is known about one replica process, for routing and for ``workers status``.

    ``restarts`` counts launches after the first (each follows a crash or a failed start);
    ``exit_code`` is the last exit's (negative: killed by that signal; None: none yet, or
    it was stopped by us after a start timeout)."""

    clock: Clock
    state: State = State.STARTING
    pid: int | None = None
    port: int | None = None
    restarts: int = 0
    exit_code: int | None = None
    since: float = field(default=0.0)
    retry_at: float | None = None  # when in backoff: the restart's time

    def __post_init__(self) -> None:
        self.since = self.clock.now()

    def move(self, target: State) -> None:
        """Enter ``target``; ``IllegalMove`` when the machine has no such move."""
        if not can_move(self.state, target):
            raise IllegalMove(f"{self.state.value} -> {target.value}")
        self.state = target
        self.since = self.clock.now()
        if target is not State.BACKOFF:
            self.retry_at = None

    def launched(self, pid: int, port: int, *, restart: bool) -> None:
        """A process was started (the first, or a restart after backoff)."""
        if self.state is State.BACKOFF:
            self.move(State.STARTING)
        self.pid, self.port = pid, port
        self.restarts += restart

    def crashed(self, exit_code: int | None) -> None:
        self.exit_code = exit_code
        self.move(State.CRASHED)

    def backing_off(self, delay_s: float) -> None:
        self.move(State.BACKOFF)
        self.retry_at = self.clock.now() + delay_s

    def stopped(self) -> None:
        self.move(State.STOPPED)
        self.pid = None

    @property
    def serving(self) -> bool:
        """Whether the router may send it requests."""
        return self.state is State.READY

    def age(self) -> float:
        """Seconds in the current state."""
        return self.clock.now() - self.since
