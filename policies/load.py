"""Load as routing sees it: how many requests the gateway holds at each target, and how a
target's time to first token grows with that number (its latency-vs-concurrency curve).

Why: a TTFT estimate learnt from past samples says nothing about the queue a target has
now. A 4-slot box answers in 250 ms with 2 requests in flight and in 6 s with 20; an
estimate that averages both is wrong for both. The gateway knows its own in-flight count
per target (every target kind, metrics feed or not), so it learns the curve itself:

- ``TargetLoad`` counts, per target label, the requests the gateway has sent and not yet
  seen finish (a stream holds its target until its last chunk).
- ``LoadCurve`` keeps, per label and per band of in-flight counts at dispatch, an EWMA of
  the log ratio of the observed TTFT to the target's no-load prediction. ``factor(label,
  n)`` is the multiplier for a request dispatched with ``n`` already in flight:

  * relative to the least-loaded band measured (that band reads 1.0: the no-load
    prediction is fitted on samples divided by their factor, and with one band only the
    split between "base" and "load" is unknowable, so the base takes it all);
  * non-decreasing in ``n`` (more requests in flight never make a target quicker): the
    bands' values are the weighted isotonic regression of their EWMAs (pool adjacent
    violators, each band weighted by its sample count, capped at ``MAX_WEIGHT``). Not the
    running maximum: TTFTs are noisy (a log-normal spread of 0.4 is ordinary), each band's
    EWMA carries some of that noise, and the maximum over a dozen noisy bands is a
    made-up slow-down of a target that has none; pooling averages the noise away;
  * above the most-loaded band measured, extended linearly through the two most-loaded
    bands (a queue in front of a fixed number of slots grows its wait linearly with its
    length, Little's law), never below the last band, capped at ``MAX_FACTOR``.

Attempts cut at their first-token deadline do not teach the curve: a target that hangs
collects cut attempts at whatever in-flight count its hung requests pile up to, and the
curve would then call it slow at that load long after it recovered (in the end-to-end run
`mid` stayed 4x "slower" for minutes after a 20 s hang). Cuts raise the target's penalty
(``policies.cuts``) instead, which real samples clear.

Pure: no I/O, time from the injected clock (bands not updated for ``max_age_s`` are
forgotten, as the latency estimates are).
"""

from __future__ import annotations

import bisect
import math

from msgspec import Struct

from core.clock import Clock

# Lower edges of the in-flight bands: exact at low counts (where slots fill up), wider
# above (where only the trend matters).
BAND_EDGES: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128)
MAX_FACTOR = 100.0
MAX_WEIGHT = 10  # a band's weight in the isotonic fit: its samples, up to this


class _Band(Struct):
    log_factor: float  # EWMA of ln(actual / no-load prediction)
    mean_n: float  # EWMA of the in-flight counts its samples were dispatched at
    at: float  # clock.now() of the last sample
    samples: int = 1


def band_of(n: int) -> int:
    """Index of the band holding an in-flight count ``n`` (negative counts as 0)."""
    return max(0, bisect.bisect_right(BAND_EDGES, n) - 1)


class LoadCurve:
    """TTFT multiplier as a function of in-flight requests, per target label (see the
    module docstring)."""

    def __init__(self, clock: Clock, alpha: float = 0.2, max_age_s: float | None = 300.0):
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self._clock = clock
        self.alpha = alpha
        self.max_age_s = max_age_s
        self._bands: dict[str, dict[int, _Band]] = {}

    def observe(self, label: str, in_flight: int, actual_s: float, no_load_s: float) -> None:
        """One TTFT sample dispatched with ``in_flight`` requests already at the target,
        against the target's no-load prediction for it. Non-positive or non-finite times
        are ignored (a log ratio needs both sides positive)."""
        sample = _log_ratio(actual_s, no_load_s)
        if sample is None:
            return
        band = self._band(label, in_flight, sample)
        if band is not None:
            band.log_factor += self.alpha * (sample - band.log_factor)
            band.mean_n += self.alpha * (in_flight - band.mean_n)
            band.samples += 1

    def _band(self, label: str, in_flight: int, first: float) -> _Band | None:
        """The band ``in_flight`` falls in, stamped now; None when it was just created
        with ``first`` (a new or stale band starts at its first sample)."""
        now = self._clock.now()
        bands = self._bands.setdefault(label, {})
        index = band_of(in_flight)
        band = bands.get(index)
        if band is None or self._stale(band.at, now):
            bands[index] = _Band(first, float(in_flight), now)
            return None
        band.at = now
        return band

    def factor(self, label: str, in_flight: int) -> float:
        """The TTFT multiplier for a request dispatched with ``in_flight`` already there
        (1.0 when nothing is known)."""
        points = self._points(label)
        if not points:
            return 1.0
        floor = points[0][1]
        target = band_of(in_flight)
        level = floor
        for index, log_factor, _ in points:
            if index > target:
                break
            level = log_factor
        factor = math.exp(level - floor)
        if target > points[-1][0] and len(points) >= 2:
            factor = max(factor, _extend(points, floor, in_flight))
        return min(factor, MAX_FACTOR)

    def _points(self, label: str) -> list[tuple[int, float, float]]:
        """Fresh bands as (index, isotonic log factor, mean in-flight), least loaded
        first."""
        now = self._clock.now()
        bands = sorted(
            (index, band)
            for index, band in self._bands.get(label, {}).items()
            if not self._stale(band.at, now)
        )
        levels = _isotonic(
            [band.log_factor for _, band in bands],
            [min(band.samples, MAX_WEIGHT) for _, band in bands],
        )
        return [
            (index, level, band.mean_n) for (index, band), level in zip(bands, levels, strict=True)
        ]

    def _stale(self, at: float, now: float) -> bool:
        return self.max_age_s is not None and now - at > self.max_age_s

    def forget(self, label: str) -> None:
        """Drop what is known of ``label`` (a target removed from the config)."""
        self._bands.pop(label, None)


def _log_ratio(actual_s: float, no_load_s: float) -> float | None:
    if not (0 < actual_s < math.inf and 0 < no_load_s < math.inf):
        return None
    return math.log(actual_s / no_load_s)


def _isotonic(values: list[float], weights: list[int]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool
    adjacent violators: a value below the one before it is averaged with it)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([value, float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, w, n = blocks.pop()
            last = blocks[-1]
            total = last[1] + w
            last[0] = (last[0] * last[1] + mean * w) / total
            last[1], last[2] = total, last[2] + n
    return [mean for mean, _, n in blocks for _ in range(int(n))]


def _extend(points: list[tuple[int, float, float]], floor: float, in_flight: int) -> float:
    """The factor above the most-loaded band: the line through the two most-loaded bands'
    (mean in-flight, factor), never below the last band's factor (see the docstring)."""
    (_, low_log, low_n), (_, top_log, top_n) = points[-2], points[-1]
    low, top = math.exp(low_log - floor), math.exp(top_log - floor)
    if top_n <= low_n or top <= low:
        return top
    slope = (top - low) / (top_n - low_n)
    return top + slope * max(0.0, in_flight - top_n)


class TargetLoad:
    """Requests the gateway holds at each target label right now. ``enter`` returns the
    count before this request (what its TTFT sample is filed under)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def enter(self, label: str) -> int:
        before = self._counts.get(label, 0)
        self._counts[label] = before + 1
        return before

    def leave(self, label: str) -> None:
        count = self._counts.get(label, 0) - 1
        if count > 0:
            self._counts[label] = count
        else:
            self._counts.pop(label, None)

    def count(self, label: str) -> int:
        return self._counts.get(label, 0)
