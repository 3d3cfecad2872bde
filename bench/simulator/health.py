"""What the simulated gateway knows about its targets, when it would know it.

Observations reach the board at the simulated time they happen (a first token at
``start + ttft``, a failure at ``start + fail_after``), through a time-ordered queue that
``advance(now)`` drains before each routing decision; so a strategy never sees the future.
The board is a ``core.routing.HealthView``. Latency estimates come from the gateway's own
``policies.latency.LatencyStats`` (default settings, as the gateway builds it), on a clock
that reads the simulated time, fed what the gateway feeds it: each first token's TTFT with
the request's prompt tokens, and each answer's decode time over its output tokens. Besides
those: in-flight counts, a consecutive-failure circuit breaker (open after ``trip_after``
failures, half-open after ``cooldown_s``, closed again on a success), and for the local
tier its live queue (saturated when a new request would wait).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from core.routing import BreakerState, TargetHealth
from policies.latency import CUT_ERROR, LatencyStats


@dataclass(frozen=True)
class Sent:
    """One attempt as the board knows it: the in-flight count before it (its load), when
    it started, and its identity for the events that follow it."""

    load: int
    start_s: float
    ident: int


@dataclass
class _Stats:
    in_flight: int = 0
    consecutive_failures: int = 0
    open_until: float | None = None


class _SimClock:
    """``core.clock.Clock`` on simulated seconds (set by the board as events apply)."""

    def __init__(self) -> None:
        self.at = 0.0

    def now(self) -> float:
        return self.at

    def wall(self) -> float:
        return self.at


@dataclass
class HealthBoard:
    """EWMAs, breakers and load per target label (see the module docstring).

    ``local_load(label, now)`` gives (running, waiting, saturated) for local targets."""

    labels: list[str]
    local_load: Callable[[str, float], tuple[int, int, bool] | None]
    trip_after: int = 5
    cooldown_s: float = 15.0
    _stats: dict[str, _Stats] = field(default_factory=dict)
    _events: list[tuple[float, int, str, str, float, int | None, int | None, int | None]] = field(
        default_factory=list
    )
    _seq: int = 0
    _waiting: dict[int, int | None] = field(default_factory=dict)  # attempt -> its ticket
    _now: float = 0.0
    _clock: _SimClock = field(default_factory=_SimClock)
    latency: LatencyStats = field(init=False)

    def __post_init__(self) -> None:
        self._stats = {label: _Stats() for label in self.labels}
        self.latency = LatencyStats(self._clock)

    # ------------------------------------------------------------ observations
    def _push(
        self,
        at_s: float,
        kind: str,
        label: str,
        value: float = 0.0,
        tokens: int | None = None,
        load: int | None = None,
        ident: int | None = None,
    ) -> None:
        self._seq += 1
        event = (at_s, self._seq, kind, label, value, tokens, load, ident)
        heapq.heappush(self._events, event)

    def cut(self, label: str, attempt: Sent, after_s: float, prompt_tokens: int) -> None:
        """An attempt the gateway gave up on ``after_s`` into it (its deadline), no token
        yet: a cut for the latency stats (a lower bound of its TTFT)."""
        at_s = attempt.start_s + after_s
        self._push(at_s, "cut", label, after_s, prompt_tokens, attempt.load, attempt.ident)

    def started(self, label: str, start_s: float, prompt_tokens: int | None = None) -> Sent:
        """An attempt sent at ``start_s``: counted in flight now, and from ``start_s`` one
        of the target's attempts waiting for a first token (``policies.overdue``) until
        its outcome's event."""
        stats = self._stats[label]
        stats.in_flight += 1
        self._seq += 1
        attempt = Sent(stats.in_flight - 1, start_s, self._seq)
        self._push(start_s, "start", label, 0.0, prompt_tokens, attempt.load, attempt.ident)
        return attempt

    def succeeded(
        self,
        label: str,
        attempt: Sent,
        ttft_s: float,
        tpot_s: float,
        end_s: float,
        prompt_tokens: int | None = None,
        output_tokens: int = 1,
    ) -> None:
        """A served attempt: its first token at its start + ``ttft_s`` (a TTFT sample, with
        ``prompt_tokens`` when given and the load it was sent at), its last at ``end_s``
        (``output_tokens`` decoded at ``tpot_s`` each)."""
        at_s = attempt.start_s + ttft_s
        self._push(at_s, "ttft", label, ttft_s, prompt_tokens, attempt.load, attempt.ident)
        self._push(end_s, "done", label, tpot_s * output_tokens, output_tokens)

    def cancelled(self, label: str, attempt: Sent, at_s: float) -> None:
        """An attempt stopped at ``at_s`` because another answered first (a hedge race's
        backup): it says nothing about its target."""
        self._push(at_s, "cancel", label, ident=attempt.ident)

    def failed(self, label: str, attempt: Sent, at_s: float) -> None:
        self._push(at_s, "fail", label, ident=attempt.ident)

    def advance(self, now_s: float) -> None:
        """Apply every observation made up to ``now_s``."""
        self._now = now_s
        while self._events and self._events[0][0] <= now_s:
            at_s, _, kind, label, value, tokens, load, ident = heapq.heappop(self._events)
            self._clock.at = at_s
            if kind == "start":
                ticket = self.latency.attempt_started(label, prompt_tokens=tokens, in_flight=load)
                self._waiting[ident or 0] = ticket
                continue
            self.latency.overdue.finish(self._waiting.pop(ident or 0, None))
            self._apply(at_s, kind, label, value, tokens, load)
        self._clock.at = now_s

    def _apply(
        self, at_s: float, kind: str, label: str, value: float, tokens: int | None, load: int | None
    ) -> None:
        stats = self._stats[label]
        if kind == "ttft":
            self.latency.observe_ttft(label, value, tokens, load)
            stats.consecutive_failures = 0
            stats.open_until = None
        elif kind == "cut":  # neither a success nor a failure for the breaker
            self.latency.attempt_finished(
                label,
                error=CUT_ERROR,
                ttft_s=value,
                retryable=False,
                prompt_tokens=tokens,
                in_flight=load,
            )
            stats.in_flight -= 1
        elif kind == "cancel":
            stats.in_flight -= 1
        elif kind == "done":
            self.latency.observe_tokens(label, tokens or 0, value)
            stats.in_flight -= 1
        else:  # a failure: the attempt is over
            stats.in_flight -= 1
            stats.consecutive_failures += 1
            half_open = stats.open_until is not None and at_s >= stats.open_until
            if stats.consecutive_failures >= self.trip_after or half_open:
                stats.open_until = at_s + self.cooldown_s

    # ------------------------------------------------------------ HealthView
    def breaker(self, label: str) -> BreakerState:
        until = self._stats[label].open_until
        if until is None:
            return "closed"
        return "open" if self._now < until else "half_open"

    def health(self, label: str) -> TargetHealth:
        stats = self._stats[label]
        load = self.local_load(label, self._now)
        running, waiting, saturated = load if load is not None else (0, 0, False)
        return msgspec.structs.replace(
            self.latency.health(label, stats.in_flight),
            breaker=self.breaker(label),
            saturated=saturated,
            waiting=waiting,
            running=running,
        )
