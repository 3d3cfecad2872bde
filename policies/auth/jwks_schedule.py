"""When to fetch an identity provider's JWKS again: pure decisions on an injected clock.

- After a successful fetch: when the IdP's ``Cache-Control: max-age`` (less ``Age``) has
  mostly run out, clamped to ``[cooldown_s, MAX_REFRESH_S]`` so neither ``max-age=0`` nor a
  year-long max-age is taken literally; ``refresh_s`` when the IdP sends none. The refresh
  is due at 90% of that lifetime, so the new set is there before the old one goes stale.
- After a failed fetch: again after ``cooldown_s``, doubling per failure in a row up to
  ``refresh_s`` (the IdP is not hammered while it is down; the known keys stay in use).
- For a token whose ``kid`` is unknown: a fetch only when none started during the last
  ``cooldown_s`` (whatever started it), so a flood of made-up kids costs the IdP at most one
  request per cooldown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from core.clock import Clock

MAX_REFRESH_S = 86_400.0  # a day: longer max-ages are honoured only this far
_REFRESH_AT = 0.9  # share of the key set's lifetime after which it is fetched again
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)\"?\s*(?:,|$)", re.IGNORECASE)
_NO_STORE = re.compile(r"(?:^|,)\s*(?:no-store|no-cache)\s*(?:[,=]|$)", re.IGNORECASE)


def max_age_of(headers: Mapping[str, str]) -> float | None:
    """The freshness lifetime an HTTP response states, in seconds, or None when it states
    none: ``Cache-Control: max-age`` less the response's ``Age``; ``no-store`` and
    ``no-cache`` count as 0 (the caller's floor then applies)."""
    control = headers.get("cache-control", "")
    if _NO_STORE.search(control):
        return 0.0
    match = _MAX_AGE.search(control)
    if match is None:
        return None
    age = headers.get("age", "").strip()
    already = int(age) if age.isdigit() else 0
    return float(max(int(match.group(1)) - already, 0))


class RefreshSchedule:
    """The fetch timing of one key source. Call ``started`` when a fetch begins, then
    ``succeeded`` or ``failed`` when it ends; ask ``due_in`` (background refresher) and
    ``may_fetch_for_unknown_kid`` (request path)."""

    def __init__(self, clock: Clock, *, refresh_s: float, cooldown_s: float) -> None:
        self._clock = clock
        self._refresh_s = refresh_s
        self._cooldown_s = cooldown_s
        self._last_start: float | None = None
        self._due = clock.now()  # nothing fetched yet: due now
        self._failures = 0

    @property
    def settings(self) -> tuple[float, float]:
        """(refresh_s, cooldown_s): schedules with equal settings may be shared."""
        return self._refresh_s, self._cooldown_s

    def started(self) -> None:
        self._last_start = self._clock.now()

    def succeeded(self, max_age_s: float | None) -> float:
        """Record a fetch that brought a usable key set; returns its lifetime in seconds."""
        self._failures = 0
        lifetime = self._refresh_s if max_age_s is None else max_age_s
        lifetime = min(max(lifetime, self._cooldown_s), max(MAX_REFRESH_S, self._cooldown_s))
        self._due = self._clock.now() + lifetime * _REFRESH_AT
        return lifetime

    def failed(self) -> float:
        """Record a failed fetch; returns the seconds until the next attempt."""
        self._failures += 1
        ceiling = max(self._refresh_s, self._cooldown_s)
        delay = min(self._cooldown_s * 2.0 ** min(self._failures - 1, 32), ceiling)
        self._due = self._clock.now() + delay
        return delay

    def due_in(self) -> float:
        """Seconds until the background refresh is due (0 when it is due now)."""
        return max(self._due - self._clock.now(), 0.0)

    def may_fetch_for_unknown_kid(self) -> bool:
        """Whether a token with an unknown kid may start a fetch now."""
        last = self._last_start
        return last is None or self._clock.now() - last >= self._cooldown_s
