"""The restart schedule of one worker replica: how long to wait before starting it again.

``RestartSchedule(initial_s, max_s, clock)``: after the n-th failure in a row the wait is
``initial_s * 2**(n-1)``, at most ``max_s``. A replica that stayed ready for ``max_s``
or longer before it failed starts the streak afresh (a crash once a day is not a crash
loop); one that fails while starting, or soon after it turned ready, keeps climbing.
Pure: time comes from the injected clock.
"""

from __future__ import annotations

from core.clock import Clock


class RestartSchedule:
    """Failures in a row and the wait they earn. ``ready()`` when the replica turns ready,
    ``failed()`` when it exits or fails to start (returns the wait before the restart)."""

    def __init__(self, initial_s: float, max_s: float, clock: Clock) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.streak = 0  # failures since the replica last stayed ready long enough
        self._clock = clock
        self._ready_at: float | None = None

    def configure(self, initial_s: float, max_s: float) -> None:
        """New limits (a reload that changed only the schedule); the streak is kept."""
        self.initial_s, self.max_s = initial_s, max_s

    def ready(self) -> None:
        self._ready_at = self._clock.now()

    def failed(self) -> float:
        """Count one failure; the seconds to wait before starting again."""
        ready_at, self._ready_at = self._ready_at, None
        if ready_at is not None and self._clock.now() - ready_at >= self.max_s:
            self.streak = 0
        self.streak += 1
        return self.delay(self.streak)

    def delay(self, streak: int) -> float:
        """The wait after the ``streak``-th failure in a row (``streak`` >= 1)."""
        if streak < 1:
            return 0.0
        # 2**62 would overflow nothing in Python, but bound the exponent all the same
        return min(self.max_s, self.initial_s * 2.0 ** min(streak - 1, 62))
