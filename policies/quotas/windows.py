"""Pure window arithmetic for quotas: which fixed window a time falls in, when it ends,
whether an amount fits, and OpenAI's reset-duration format. No I/O, no clock reads.

Windows are FIXED and aligned to UTC: the minute (RPM, TPM), the UTC day and the UTC month
(spend). Every replica derives the same window from the same wall-clock second, so the
window id can be part of the counter's key and Redis never needs its own clock.

Trade-off (chosen on purpose): a fixed window guarantees "admitted per window <= limit"
exactly and costs one counter per limit, but a client may use a full window's budget at the
end of one minute and again at the start of the next, i.e. up to 2x the limit within any
sliding 60 s span. Sliding logs would remove that at the price of one entry per request.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from enum import Enum

# Float counters (USD) accumulate rounding noise; a request that fits up to this much is
# admitted. Integer counters compare exactly (their amounts are whole numbers).
EPSILON = 1e-9

_DAY_S = 86_400


class Window(Enum):
    MINUTE = "m"
    DAY = "d"
    MONTH = "mo"


# A one-entry cache of the last month seen: datetime arithmetic is the costly part of a
# quota check, and nearly every call falls in the same month.
_last_month: list[tuple[int, float, float]] = [(0, 0.0, 0.0)]


def _month_bounds(now: float) -> tuple[int, float, float]:
    cached = _last_month[0]
    if cached[1] <= now < cached[2]:
        return cached
    moment = datetime.fromtimestamp(now, UTC)
    start = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    nxt = datetime(moment.year + moment.month // 12, moment.month % 12 + 1, 1, tzinfo=UTC)
    found = (moment.year * 12 + moment.month - 1, start.timestamp(), nxt.timestamp())
    _last_month[0] = found
    return found


def bounds(window: Window, now: float) -> tuple[int, float, float]:
    """(window id, start, end) of the window holding Unix time ``now``; start <= now < end.
    Ids increase with time and differ between consecutive windows of one kind."""
    if window is Window.MINUTE:
        idx = math.floor(now / 60)
        return idx, idx * 60.0, (idx + 1) * 60.0
    if window is Window.DAY:  # Unix time has no leap seconds: days are exactly 86400 s
        idx = math.floor(now / _DAY_S)
        return idx, float(idx * _DAY_S), float((idx + 1) * _DAY_S)
    return _month_bounds(now)


def seconds_left(window: Window, now: float) -> float:
    """Seconds until the window holding ``now`` ends (> 0)."""
    return bounds(window, now)[2] - now


def fits(used: float, amount: float, limit: float) -> bool:
    """Whether reserving ``amount`` on top of ``used`` stays within ``limit``.
    The Lua script makes the same comparison."""
    return used + amount <= limit + EPSILON


def remaining(used: float, limit: float) -> float:
    """What is left of ``limit`` (never negative: settles may push usage past it)."""
    return max(0.0, limit - used)


def format_reset(seconds: float) -> str:
    """OpenAI's x-ratelimit-reset-* duration: ``"250ms"``, ``"12s"``, ``"8.64s"``, ``"1m3s"``,
    ``"6m0s"``, ``"1h2m3s"``. Negative inputs count as 0."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest_ms = divmod(ms, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    secs = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
