"""The overview's time ranges and what it shows over them, from the in-process timelines
(``gateway.telemetry.recent``)."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from core.errors import InvalidRequestError
from gateway.telemetry.recent import MINUTE_S, Minute, Point, Timeline, point_of

# range -> (span, step, label); the timelines keep 6 hours
RANGES: dict[str, tuple[float, float, str]] = {
    "15m": (15 * MINUTE_S, MINUTE_S, "15 minutes"),
    "1h": (60 * MINUTE_S, MINUTE_S, "1 hour"),
    "6h": (360 * MINUTE_S, 5 * MINUTE_S, "6 hours"),
}


def range_of(name: str) -> tuple[float, float]:
    """(span, step) in seconds of a range's name; 400 naming ``range`` for another."""
    found = RANGES.get(name)
    if found is None:
        raise InvalidRequestError(
            f"range must be one of {', '.join(RANGES)}; got {name[:16]!r}", param="range"
        )
    return found[0], found[1]


def summary(timeline: Timeline, now: float, span_s: float) -> Point:
    """Totals and percentiles over the whole span up to ``now`` (the minutes that started
    after ``now - span_s``, the current one included)."""
    since = math.floor(now / MINUTE_S) * MINUTE_S - span_s + MINUTE_S
    merged = Minute()
    for start, minute in timeline.minutes.items():
        if since <= start <= now:
            merged.merge(minute)
    return point_of(since, merged)


def chart_data(timeline: Timeline, now: float, name: str) -> dict[str, Any]:
    """The overview's charts' JSON: the range, its step and one point per step."""
    span_s, step_s = range_of(name)
    points = timeline.series(now, span_s, step_s)
    return {"range": name, "step_s": step_s, "points": msgspec.to_builtins(points)}
