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
    running maximum of the raw EWMAs: TTFTs are noisy (a log-normal spread of 0.4 is
    ordinary), each band's EWMA carries some of that noise, and the maximum over a dozen
    noisy bands is a made-up slow-down of a target that has none; pooling averages the
    noise away;
  * counting only the part of a band's excess over the least-loaded one that lies beyond
    ``significance_z`` (1) standard error of the two (each band keeps its variance: a
    prior that counts as one sample, then an EWMA of squared deviations; a pooled block's
    variance and weight are its bands'), the running maximum of that kept. Without this a
    target with no queue at all (a managed API whose in-flight count only rises with the
    share of long prompts) read up to 4x slower at its busiest, from noise in sparse
    bands, extended linearly; its predictions swung from 57 ms to 1.3 s and an 800 ms
    request went to a slower target as "closest". A real queue is many standard errors
    deep and is still learnt from a handful of samples;
  * above the most-loaded band measured, extended linearly through the two most-loaded
    bands (a queue in front of a fixed number of slots grows its wait linearly with its
    length, Little's law), never below the last band, capped at ``MAX_FACTOR``.

``knee(label)`` is the fewest in flight at which the curve reads the target slowed: where
its queue starts, read by ``routers.strategies.slo`` to keep room free there for requests
with objectives of their own. ``unmapped(label, n)``: whether ``n`` falls in a band with no
sample above the least-loaded one, where the factor is a guess (``policies.latency`` keeps
such samples out of the no-load fit).

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
import itertools
import math

from msgspec import Struct

from core.clock import Clock

# Lower edges of the in-flight bands: exact at low counts (where slots fill up), wider
# above (where only the trend matters).
BAND_EDGES: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128)
MAX_FACTOR = 100.0
MAX_WEIGHT = 10  # a band's weight in the isotonic fit: its samples, up to this
PRIOR_VARIANCE = 0.4**2  # a band's log-ratio variance before its samples say (log-normal 0.4)
SIGNIFICANCE_Z = 1.0  # a slow-down counts only beyond this many standard errors


class _Band(Struct):
    log_factor: float  # EWMA of ln(actual / no-load prediction)
    mean_n: float  # EWMA of the in-flight counts its samples were dispatched at
    at: float  # clock.now() of the last sample
    samples: int = 1
    variance: float = PRIOR_VARIANCE  # EWMA of the squared deviation from log_factor
    most: int = 0  # the most in flight any of its samples was dispatched at


class _Level(Struct, frozen=True):
    """One fresh band after the isotonic fit: its index, level (log factor), mean in-flight
    count, and the pooled block's weight and variance (for the level's standard error)."""

    index: int
    level: float
    mean_n: float
    weight: float
    variance: float


def band_of(n: int) -> int:
    """Index of the band holding an in-flight count ``n`` (negative counts as 0)."""
    return max(0, bisect.bisect_right(BAND_EDGES, n) - 1)


class LoadCurve:
    """TTFT multiplier as a function of in-flight requests, per target label (see the
    module docstring)."""

    def __init__(
        self,
        clock: Clock,
        alpha: float = 0.2,
        max_age_s: float | None = 300.0,
        significance_z: float = SIGNIFICANCE_Z,
    ):
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self._clock = clock
        self.alpha = alpha
        self.z = significance_z
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
            deviation = sample - band.log_factor
            # The prior variance counts as one sample: a plain mean of squares until the
            # EWMA's own weight takes over, so a handful of consistent samples (a real
            # queue) narrows the error quickly and a handful of noisy ones does not.
            share = max(self.alpha, 1.0 / (band.samples + 1))
            band.variance += share * (deviation * deviation - band.variance)
            band.log_factor += self.alpha * deviation
            band.mean_n += self.alpha * (in_flight - band.mean_n)
            band.samples += 1
            band.most = max(band.most, in_flight)

    def _band(self, label: str, in_flight: int, first: float) -> _Band | None:
        """The band ``in_flight`` falls in, stamped now; None when it was just created
        with ``first`` (a new or stale band starts at its first sample)."""
        now = self._clock.now()
        bands = self._bands.setdefault(label, {})
        index = band_of(in_flight)
        band = bands.get(index)
        if band is None or self._stale(band.at, now):
            bands[index] = _Band(first, float(in_flight), now, most=in_flight)
            return None
        band.at = now
        return band

    def factor(self, label: str, in_flight: int) -> float:
        """The TTFT multiplier for a request dispatched with ``in_flight`` already there
        (1.0 when nothing is known)."""
        return self.read(label, in_flight)[0]

    def knee(self, label: str) -> int | None:
        """The fewest requests in flight at dispatch at which the curve reads ``label``
        slowed (the lower edge of its first slowed band: a queue starts there); None while
        no band reads slowed."""
        return self.read(label, 0)[1]

    def read(self, label: str, in_flight: int) -> tuple[float, int | None]:
        """``(factor(label, in_flight), knee(label))`` from one isotonic fit: what a
        target's health shows for every request."""
        points, factors = self._curve(label)
        if not points:
            return 1.0, None
        target = band_of(in_flight)
        factor, knee = 1.0, None
        for point, value in zip(points, factors, strict=True):
            if knee is None and value > 1.0:
                knee = BAND_EDGES[point.index]
            if point.index <= target:
                factor = value
        if target > points[-1].index and len(points) >= 2:
            factor = max(factor, _extend(points[-2:], factors[-2:], in_flight))
        return min(factor, MAX_FACTOR), knee

    def unmapped(self, label: str, in_flight: int) -> bool:
        """Whether ``in_flight`` falls in a band with no fresh sample above the least-loaded
        one measured: the curve's value there is an extrapolation (1.0 above one band),
        so a sample there says how much slower the target is at that load, and nothing of
        its no-load TTFT (``policies.latency`` keeps it out of the fits)."""
        fresh = self._fresh(label)
        index = band_of(in_flight)
        return bool(fresh) and index > min(fresh) and index not in fresh

    def most_seen(self, label: str) -> int | None:
        """The most requests in flight any fresh sample of ``label`` was dispatched with
        (None: no fresh sample): beyond it the factor is an extrapolation."""
        return max((band.most for band in self._fresh(label).values()), default=None)

    def _fresh(self, label: str) -> dict[int, _Band]:
        """``label``'s bands not yet forgotten, by index."""
        now = self._clock.now()
        bands = self._bands.get(label, {})
        return {index: band for index, band in bands.items() if not self._stale(band.at, now)}

    def _curve(self, label: str) -> tuple[list[_Level], list[float]]:
        """Fresh bands after the isotonic fit, least loaded first, with their factors. The
        running maximum keeps the factor non-decreasing: a band with fewer samples (a
        wider error) may count for less than the band below it."""
        bands = sorted(self._fresh(label).items())
        blocks = _isotonic(
            [band.log_factor for _, band in bands],
            [float(min(band.samples, MAX_WEIGHT)) for _, band in bands],
            [band.variance for _, band in bands],
        )
        points = [
            _Level(index, level, band.mean_n, weight, variance)
            for (index, band), (level, weight, variance) in zip(bands, blocks, strict=True)
        ]
        significant = (_significant(point, points[0], self.z) for point in points)
        return points, list(itertools.accumulate(significant, max))

    def _stale(self, at: float, now: float) -> bool:
        return self.max_age_s is not None and now - at > self.max_age_s

    def forget(self, label: str) -> None:
        """Drop what is known of ``label`` (a target removed from the config)."""
        self._bands.pop(label, None)


def _log_ratio(actual_s: float, no_load_s: float) -> float | None:
    if not (0 < actual_s < math.inf and 0 < no_load_s < math.inf):
        return None
    return math.log(actual_s / no_load_s)


def _isotonic(
    values: list[float], weights: list[float], variances: list[float]
) -> list[tuple[float, float, float]]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool
    adjacent violators: a value below the one before it is averaged with it), each value
    with its pooled block's total weight and weighted mean variance."""
    blocks: list[list[float]] = []  # [weighted mean, weight, weighted variance, count]
    for value, weight, variance in zip(values, weights, variances, strict=True):
        blocks.append([value, weight, variance, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, w, var, n = blocks.pop()
            last = blocks[-1]
            total = last[1] + w
            last[0] = (last[0] * last[1] + mean * w) / total
            last[2] = (last[2] * last[1] + var * w) / total
            last[1], last[3] = total, last[3] + n
    return [(mean, w, var) for mean, w, var, n in blocks for _ in range(int(n))]


def _significant(point: _Level, floor: _Level, z: float) -> float:
    """``point``'s factor over the least-loaded band, counting only the part of the
    difference beyond ``z`` standard errors: noise in a few samples (or in a
    sparse least-loaded band, the reference of every other) reads as no slow-down, while a
    real queue, many standard errors deep, is learnt from a handful of samples."""
    excess = point.level - floor.level
    if excess <= 0:
        return 1.0
    error = math.sqrt(point.variance / point.weight + floor.variance / floor.weight)
    return math.exp(max(0.0, excess - z * error))


def _extend(points: list[_Level], factors: list[float], in_flight: int) -> float:
    """The factor above the most-loaded band: the line through the two most-loaded bands'
    (mean in-flight, factor), never below the last band's factor (see the docstring)."""
    (low_point, top_point), (low, top) = points, factors
    if top_point.mean_n <= low_point.mean_n or top <= low:
        return top
    slope = (top - low) / (top_point.mean_n - low_point.mean_n)
    return top + slope * max(0.0, in_flight - top_point.mean_n)


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
