"""A retry budget per target (Finagle's RetryBudget, Envoy's retry_budget): retries may add
at most ``ratio`` of the recent calls, plus a floor of ``min_per_s``, so a target that is
down does not get its load multiplied by every caller's retries. Pure: time from a clock.

Rule, per target label, over the last ``window_s`` seconds::

    a retry is allowed while  retries + 1 <= ratio * calls + min_per_s * window_s

``calls`` are first attempts (``record_call``); ``retries`` are the retries the budget
allowed (``try_retry``). Both are kept as timestamps and forgotten after ``window_s``, so
the budget refills as the window slides: the token-bucket behaviour without a timer.

The same rule caps hedged attempts (``routers.hedge.hedge_budget``): per model alias,
"calls" are requests that could hedge and "retries" the hedges, with the alias's share as
the ratio.
"""

from __future__ import annotations

from collections import deque

from core.clock import Clock
from core.config_routing import RetryBudgetConfig


class _Window:
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
        self._calls: dict[str, _Window] = {}
        self._retries: dict[str, _Window] = {}

    def _windows(self, label: str) -> tuple[_Window, _Window]:
        if label not in self._calls:
            self._calls[label] = _Window(self._config.window_s)
            self._retries[label] = _Window(self._config.window_s)
        return self._calls[label], self._retries[label]

    def record_call(self, label: str) -> None:
        """A first attempt went to ``label`` (it earns the target ``ratio`` of a retry)."""
        self._windows(label)[0].add(self._clock.now())

    def allowance(self, label: str, ratio: float | None = None) -> float:
        """How many retries the window holds in all (spent or not); ``ratio`` in place of
        the configured one (hedges: each model alias has its own share)."""
        calls, _ = self._windows(label)
        c = self._config
        share = c.ratio if ratio is None else ratio
        return share * calls.count(self._clock.now()) + c.min_per_s * c.window_s

    def try_retry(self, label: str, ratio: float | None = None) -> bool:
        """Spend one retry on ``label`` if the budget has one; False means: do not retry
        this target now (fall back to the next one instead). ``ratio``: see
        ``allowance``."""
        now = self._clock.now()
        _, retries = self._windows(label)
        if retries.count(now) + 1 > self.allowance(label, ratio):
            return False
        retries.add(now)
        return True
