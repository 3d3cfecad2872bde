"""A retry budget per target (Finagle's RetryBudget, Envoy's retry_budget): retries may add
at most ``ratio`` of the recent calls, plus a floor of ``min_per_s``, so a target that is
down does not get its load multiplied by every caller's retries. Pure: time from a clock.

Rule, per target label, over the last ``window_s`` seconds::

    a retry is allowed while  retries + 1 <= ratio * calls + min_per_s * window_s

``calls`` are first attempts (``record_call``); ``retries`` are the retries the budget
allowed (``try_retry``). Both are kept as timestamps and forgotten after ``window_s``, so
the budget refills as the window slides: the token-bucket behaviour without a timer.
"""

from __future__ import annotations

from collections import deque

from core.clock import Clock
from core.config_routing import RetryBudgetConfig


class EventWindow:
    """Timestamps of one kind of event in the last ``window_s`` seconds."""

    __slots__ = ("_events", "_window_s")

    def __init__(self, window_s: float) -> None:
        self._events: deque[float] = deque()
        self._window_s = window_s

    def add(self, now: float) -> None:
        self._events.append(now)

    def count(self, now: float) -> int:
        horizon = now - self._window_s
        while self._events and self._events[0] <= horizon:
            self._events.popleft()
        return len(self._events)


class RetryBudget:
    """Per-target retry allowance. Not thread-safe (one event loop)."""

    def __init__(self, config: RetryBudgetConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._calls: dict[str, EventWindow] = {}
        self._retries: dict[str, EventWindow] = {}

    def _windows(self, label: str) -> tuple[EventWindow, EventWindow]:
        if label not in self._calls:
            self._calls[label] = EventWindow(self._config.window_s)
            self._retries[label] = EventWindow(self._config.window_s)
        return self._calls[label], self._retries[label]

    def record_call(self, label: str) -> None:
        """A first attempt went to ``label`` (it earns the target ``ratio`` of a retry)."""
        self._windows(label)[0].add(self._clock.now())

    def allowance(self, label: str) -> float:
        """How many retries the window holds in all (spent or not)."""
        calls, _ = self._windows(label)
        c = self._config
        return c.ratio * calls.count(self._clock.now()) + c.min_per_s * c.window_s

    def try_retry(self, label: str) -> bool:
        """Spend one retry on ``label`` if the budget has one; False means: do not retry
        this target now (fall back to the next one instead)."""
        now = self._clock.now()
        _, retries = self._windows(label)
        if retries.count(now) + 1 > self.allowance(label):
            return False
        retries.add(now)
        return True
