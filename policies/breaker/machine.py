"""The circuit breaker's state machine, pure: state lives in a flat ``dict[str, float]``
(the same fields as the Redis hash that ``scripts`` keeps, so one set of rules serves the
local breaker, the memory store's script twins and, transcribed, the Lua scripts).

Rules (``BreakerConfig``)::

    closed    -> open       a failure that makes consecutive_failures in a row, or leaves
                            >= min_calls in the window with a failure share >= failure_rate
    open      -> half_open  cooldown_s after opening (read lazily)
    half_open               admits at most half_open_probes concurrent probes (try_probe)
    half_open -> closed     a success
    half_open -> open       a failure (a fresh cool-down)

The rolling window is ``BUCKETS`` time buckets of ``window_s / BUCKETS`` seconds each, so
an outcome stops counting between ``window_s - window_s/BUCKETS`` and ``window_s`` after it
happened (bounded state instead of one timestamp per call). Outcomes that arrive while
open are ignored (calls that started before it opened). A probe slot held longer than
``cooldown_s`` is presumed lost (a crashed replica) and handed out again.

Fields: ``s`` state (0 closed, 1 open, 2 half_open), ``t`` when it opened, ``c`` consecutive
failures, ``p`` probes out, ``q`` when the last probe was handed out, ``e<i>``/``n<i>``/
``f<i>`` bucket i's epoch, calls and failures.
"""

from __future__ import annotations

import math
from typing import Literal

from core.config_routing import BreakerConfig
from core.routing import BreakerState

Fields = dict[str, float]
Outcome = Literal["success", "failure", "neutral"]

CLOSED, OPEN, HALF_OPEN = 0, 1, 2
BUCKETS = 10
STATE_NAMES: tuple[BreakerState, BreakerState, BreakerState] = ("closed", "open", "half_open")

# Errors that say something about the target itself. A 400 says the request was wrong
# (success for the breaker); anything else (a cancelled call, the gateway's own bugs)
# says nothing either way. UpstreamAuthError is included: refused credentials fail every
# call to that target until someone fixes them, so skipping it saves each request a
# round trip.
FAILURES = frozenset(
    {
        "UpstreamTimeoutError",
        "UpstreamConnectError",
        "UpstreamServerError",
        "UpstreamMalformedError",
        "UpstreamRateLimitedError",
        "UpstreamAuthError",
    }
)
SUCCESSES = frozenset({"UpstreamBadRequestError"})


def classify(error: str | None) -> Outcome:
    """The breaker's view of an attempt's result (``error`` = error class name)."""
    if error is None or error in SUCCESSES:
        return "success"
    return "failure" if error in FAILURES else "neutral"


def current_state(f: Fields, config: BreakerConfig, now: float) -> int:
    """The state code at ``now``; turns open into half_open once the cool-down is over."""
    state = int(f.get("s", CLOSED))
    if state == OPEN and now - f.get("t", 0.0) >= config.cooldown_s:
        f["s"], f["p"] = HALF_OPEN, 0
        return HALF_OPEN
    return state


def _epoch(config: BreakerConfig, now: float) -> int:
    return math.floor(now / (config.window_s / BUCKETS))


def window_counts(f: Fields, config: BreakerConfig, now: float) -> tuple[int, int]:
    """(calls, failures) in the rolling window at ``now``."""
    epoch = _epoch(config, now)
    calls = failures = 0
    for i in range(BUCKETS):
        seen = f.get(f"e{i}")
        if seen is not None and epoch - seen < BUCKETS:
            calls += int(f.get(f"n{i}", 0))
            failures += int(f.get(f"f{i}", 0))
    return calls, failures


def _add(f: Fields, config: BreakerConfig, now: float, failed: int) -> None:
    epoch = _epoch(config, now)
    i = epoch % BUCKETS
    if f.get(f"e{i}") != epoch:
        f[f"e{i}"], f[f"n{i}"], f[f"f{i}"] = epoch, 0, 0
    f[f"n{i}"] += 1
    f[f"f{i}"] += failed


def _reset_window(f: Fields) -> None:
    for i in range(BUCKETS):
        for name in (f"e{i}", f"n{i}", f"f{i}"):
            f.pop(name, None)
    f["c"] = 0


def _trip(f: Fields, now: float) -> None:
    _reset_window(f)
    f["s"], f["t"], f["p"] = OPEN, now, 0


def record(f: Fields, config: BreakerConfig, now: float, outcome: Outcome) -> int:
    """Apply one attempt's outcome; returns the new state code."""
    state = current_state(f, config, now)
    if outcome == "neutral":
        if state == HALF_OPEN:
            f["p"] = max(0.0, f.get("p", 0.0) - 1)
        return state
    if state == HALF_OPEN:
        if outcome == "success":
            _reset_window(f)
            f["s"], f["p"] = CLOSED, 0
        else:
            _trip(f, now)
        return int(f.get("s", CLOSED))
    if state == OPEN:
        return state
    failed = 1 if outcome == "failure" else 0
    _add(f, config, now, failed)
    if not failed:
        f["c"] = 0
        return CLOSED
    f["c"] = f.get("c", 0.0) + 1
    calls, failures = window_counts(f, config, now)
    rate_hit = calls >= config.min_calls and failures >= config.failure_rate * calls
    if f["c"] >= config.consecutive_failures or rate_hit:
        _trip(f, now)
    return int(f.get("s", CLOSED))


def acquire_probe(f: Fields, config: BreakerConfig, now: float) -> bool:
    """May a call go to this target now? Closed: yes. Open: no. Half-open: yes while
    fewer than ``half_open_probes`` probes are out (taking a slot)."""
    state = current_state(f, config, now)
    if state != HALF_OPEN:
        return state == CLOSED
    out = f.get("p", 0.0)
    if out >= config.half_open_probes and now - f.get("q", 0.0) >= config.cooldown_s:
        out = 0.0  # the probes handed out that long ago are presumed lost
    if out < config.half_open_probes:
        f["p"], f["q"] = out + 1, now
        return True
    f["p"] = out
    return False


class BreakerMachine:
    """One target's breaker in this process (the pure rules over one ``Fields`` dict)."""

    def __init__(self, config: BreakerConfig, fields: Fields | None = None) -> None:
        self.config = config
        self.fields: Fields = fields if fields is not None else {}

    def state(self, now: float) -> BreakerState:
        return STATE_NAMES[current_state(self.fields, self.config, now)]

    def try_probe(self, now: float) -> bool:
        return acquire_probe(self.fields, self.config, now)

    def record(self, now: float, outcome: Outcome) -> BreakerState:
        return STATE_NAMES[record(self.fields, self.config, now, outcome)]
