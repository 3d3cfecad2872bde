"""Goodput: requests that met their latency objective, per second, per model alias, over a
sliding window. What an SLO-routed gateway is for, measured where it can be: at the
gateway, from a request's arrival to its first byte out (its whole answer, unstreamed).

A request counts once it ends. It "has an objective" when routing resolved a TTFT
objective for it (header, tenant or alias; a strategy's default objective does not count:
the client asked for nothing); it "met" it when it ended with 200 and its time to first
byte was within the objective. Requests without an objective count as finished only.

Pure: one-second buckets on the injected clock, ``window_s`` of them kept.
"""

from __future__ import annotations

import math

from msgspec import Struct

from core.clock import Clock

DEFAULT_WINDOW_S = 60


class Goodput(Struct, frozen=True):
    """One alias's counts over the last ``window_s`` seconds. ``goodput_per_s``: met
    objectives per second; ``attainment``: met / with an objective (None: none had one)."""

    window_s: int
    requests: int
    with_objective: int
    met: int
    goodput_per_s: float
    attainment: float | None


class _Bucket(Struct):
    second: int
    requests: int = 0
    with_objective: int = 0
    met: int = 0


class GoodputMeter:
    """Counts finished requests per alias in one-second buckets (see the module docstring)."""

    def __init__(self, clock: Clock, window_s: int = DEFAULT_WINDOW_S) -> None:
        if window_s < 1:
            raise ValueError("window_s must be >= 1")
        self._clock = clock
        self.window_s = window_s
        self._buckets: dict[str, list[_Bucket]] = {}

    def record(
        self, model: str, *, objective_ms: float | None, ttft_s: float | None, ok: bool
    ) -> bool | None:
        """Count one finished request; returns whether it met its objective (None: it had
        none)."""
        met = (
            None
            if objective_ms is None
            else bool(ok and ttft_s is not None and ttft_s * 1000 <= objective_ms)
        )
        bucket = self._bucket(model)
        bucket.requests += 1
        if met is not None:
            bucket.with_objective += 1
            bucket.met += met
        return met

    def _bucket(self, model: str) -> _Bucket:
        second = math.floor(self._clock.now())
        buckets = self._buckets.setdefault(model, [])
        if not buckets or buckets[-1].second != second:
            buckets.append(_Bucket(second))
            cutoff = second - self.window_s
            while buckets[0].second <= cutoff:
                buckets.pop(0)
        return buckets[-1]

    def snapshot(self) -> dict[str, Goodput]:
        """Every alias seen in the window, with its counts."""
        cutoff = math.floor(self._clock.now()) - self.window_s
        out: dict[str, Goodput] = {}
        for model, buckets in self._buckets.items():
            live = [b for b in buckets if b.second > cutoff]
            if not live:
                continue
            with_objective = sum(b.with_objective for b in live)
            met = sum(b.met for b in live)
            out[model] = Goodput(
                window_s=self.window_s,
                requests=sum(b.requests for b in live),
                with_objective=with_objective,
                met=met,
                goodput_per_s=met / self.window_s,
                attainment=met / with_objective if with_objective else None,
            )
        return out
